"""TGB's link-prediction evaluation protocol for the CTDG :class:`~tgl_dist.ctdg.Trainer`
(``eval_protocol='tgb'``).

What TGB's own examples do (py-tgb, ``examples/linkproppred/tgbl-wiki/tgn.py``):

* training keeps one random negative per positive (as here with ``'random'``);
* validation and test rank every positive against ITS OWN pre-generated negatives (the
  dataset's ``*_val_ns*.pkl`` / ``*_test_ns*.pkl``), one-vs-many, with TGB's
  ``Evaluator`` (MRR; hits@10 besides), averaged over all positives of the split;
* the memory is updated with each batch's positives after the batch is scored;
* the model is selected (and stopped early) on validation MRR.

Here each rank holds the negatives of its own events of the split, stored with its
partition (rank 0 reads TGB's file once when it partitions), the loader hands them out
as any negatives (:class:`~tgl_dist.sampling.fixed.FixedNegatives`: the same step layout,
short lists padded with a valid node and masked), and :class:`TGBMetrics` ranks each
positive among its real negatives and averages over the whole split, gathered from all
ranks. The memory write-back is untouched (positives only, after each step). EdgeBank
(unlimited memory, TGB's baseline) is scored on the same negatives.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Union

import torch
from torch import Tensor

from tgl_dist.ctdg.run import LoaderTap, RunSetupError
from tgl_dist.data.loaders.tgb import TGB_DATASETS, tgb_spec
from tgl_dist.dist.exchange import all_reduce_max_int, broadcast_object
from tgl_dist.metrics import EdgeBankMetrics
from tgl_dist.metrics.tgb import TGBMetrics
from tgl_dist.sampling.fixed import FixedNegatives

log = logging.getLogger(__name__)

PROTOCOLS = ("random", "tgb")
K_VALUE = 10   # TGB reports hits@10 beside MRR


def tgb_dataset_name(data: Any) -> str:
    """TGB's name of ``data`` (a dataset name, or a graph with a ``.name``), or
    :class:`RunSetupError` saying what ``eval_protocol='tgb'`` needs."""
    name = data if isinstance(data, str) else getattr(data, "name", None)
    try:
        return tgb_spec(str(name)).name
    except ValueError:
        pass
    raise RunSetupError(
        f"eval_protocol='tgb' needs a TGB link dataset ({', '.join(TGB_DATASETS)}) with TGB's "
        f"pre-generated validation and test negatives (<root>/tgbl_wiki/tgbl-wiki_val_ns_v2.pkl "
        f"and ..._test_ns_v2.pkl for tgbl-wiki); got data {name!r}. Pass the TGB name "
        f"(e.g. data='tgbl-wiki', root= the folder holding tgbl_wiki/), or use "
        f"eval_protocol='random' (our sampled negatives, --eval-neg per positive)")


class TGBProtocol:
    """TGB's validation and test negatives for this rank's events, and the per-split
    metrics (collective construction: every rank builds it).

    The lists come from the rank's partition (``pdata.eval_negatives``: the rows of its
    own events, mapped from ``part_<r>/eval_negatives.pt``), which
    :func:`~tgl_dist.ctdg.run.ensure_partition` writes with ``tgb_negatives=True``
    from TGB's ``*_ns*.pkl``: no rank reads the whole file (rank 0 did, once, when it
    partitioned).

    Args:
        name: the TGB dataset (``tgbl-wiki``, ...).
        graph: this rank's :class:`~tgl_dist.graph.DistributedGraphStore` (its
            ``pdata.eval_negatives`` must cover ``split_events('val')`` / ``('test')``).
        group: process group of the setup's agreement (errors, the row width).

    Attributes:
        negatives: ``{'val': FixedNegatives, 'test': FixedNegatives}``, q = the widest
            list of the split over all ranks.

    Raises:
        RunSetupError: on every rank, when a rank's partition lacks its negatives (written
            without them, or by another version); the message is the first failing rank's.
    """

    def __init__(self, name: str, graph: Any, group=None) -> None:
        self.name = tgb_spec(name).name
        stored = getattr(getattr(graph, "pdata", None), "eval_negatives", None) or {}
        tables, err = {}, None
        for split in ("val", "test"):
            tab, ev = stored.get(split), graph.split_events(split)
            if tab is None:
                err = (f"eval_protocol='tgb': the partition holds no TGB negatives of the "
                       f"{split} split (it was written without them): partition it with "
                       f"them, ensure_partition(..., tgb_negatives=True) as the Trainer does, "
                       f"or python -m tgl_dist.partition --data {self.name} --root <the "
                       f"folder holding {tgb_spec(self.name).folder}/>")
                break
            if not torch.equal(tab.eid, ev.eid.to(tab.eid.dtype)):
                err = (f"eval_protocol='tgb': the partition's {split} negatives are of "
                       f"{tab.eid.numel()} events, this rank owns {ev.eid.numel()} of the "
                       f"split: partition again (repartition=True, or --force)")
                break
            tables[split] = tab
        rank = getattr(graph, "rank", 0)
        bad = all_reduce_max_int(rank + 1 if err else 0, group)
        if bad:
            err = broadcast_object(err, src=bad - 1, group=group)
            raise RunSetupError(err if bad - 1 == rank else f"rank {bad - 1}: {err}")
        self.negatives: Dict[str, FixedNegatives] = {}
        for split, tab in tables.items():
            q = all_reduce_max_int(tab.num_neg, group)
            if q < 1:
                raise RunSetupError(f"eval_protocol='tgb': the {split} split of {self.name} "
                                    f"has no negatives in TGB's file")
            self.negatives[split] = FixedNegatives(tab, width=q)
            log.info("%s %s: TGB's negatives, %d per positive (padded lists masked)",
                     self.name, split, q)

    def tap(self, loader: Any, edgebank: Optional[EdgeBankMetrics] = None) -> "TGBTap":
        """``loader`` as ``run_epoch`` sees it for one evaluation pass (see :class:`TGBTap`)."""
        return TGBTap(loader, edgebank)


class TGBTap(LoaderTap):
    """One evaluation pass under TGB's protocol: wraps the loader (recording each step's
    padding mask, and feeding EdgeBank the real negatives with ``-1`` for padding) and
    collects TGB's ranks of the model's scores (:meth:`scores` wraps the trainer's
    metric fan-out)."""

    def __init__(self, loader: Any, edgebank: Optional[EdgeBankMetrics]) -> None:
        super().__init__(loader)
        self._eb = edgebank
        self.metrics = TGBMetrics(K_VALUE)
        self._mask: Optional[Tensor] = None     # [B, q] of the step being scored

    def on_step(self, step: int, roots: Any, meta: Dict[str, Any]) -> None:
        # run_epoch scores this step before it asks for the next one: the mask is its own
        B, k = int(meta["num_pos"]), int(meta["neg_k"])
        if "neg_mask" not in roots.extra:
            raise RuntimeError("eval_protocol='tgb': the evaluation loader's negatives are "
                               "not TGB's (no roots.extra['neg_mask']); build it with "
                               "TGBProtocol.negatives[split]")
        mask = roots.extra["neg_mask"].view(k, B).t()
        self._mask = mask
        if self._eb is not None:
            nd = roots.extra["neg_dst"].view(k, B).t().masked_fill(~mask, -1)
            self._eb.update(step, roots.src, roots.dst, nd)

    def scores(self, main: Any, extra: Mapping[str, Any]) -> "_TGBScores":
        """The scores' fan-out: TGB's ranks (masked), ``main`` (AP / AUC against the first
        negative, always a real one) and the custom metrics (all q scores, padding
        included: pad entries repeat the positive's destination)."""
        return _TGBScores(self, main, extra)

    def compute(self, split: str, group=None) -> Dict[str, float]:
        """``{'<split>_mrr', '<split>_hits@10'}`` over the whole split (a collective)."""
        r = self.metrics.compute(group)
        return {f"{split}_mrr": float(r["mrr"]), f"{split}_hits@{K_VALUE}":
                float(r[f"hits@{K_VALUE}"])}


class _TGBScores:
    def __init__(self, tap: TGBTap, main: Any, extra: Mapping[str, Any]) -> None:
        self.tap, self.main, self.extra = tap, main, extra

    def update(self, pos: Tensor, neg: Tensor, neg_k: Optional[Tensor] = None) -> None:
        """``pos [B]``, ``neg [B]`` (first negatives), ``neg_k [B, q]`` (None when q = 1)."""
        allneg = neg_k if neg_k is not None else neg.reshape(-1, 1)
        if pos.numel():
            self.tap.metrics.update(pos, allneg, self.tap._mask)
        self.main.update(pos, neg, None)   # its MRR would count the padding: TGB's replaces it
        for m in self.extra.values():
            m.update(pos, neg, neg_k)


def csv_fields() -> List[str]:
    """The per-epoch CSV columns the protocol adds."""
    return [f"val_hits@{K_VALUE}", f"test_hits@{K_VALUE}"]


def summary_fields(best: Mapping[str, Any], edgebank: Optional[Mapping[str, float]]
                   ) -> Dict[str, Union[str, float]]:
    """What the protocol adds to the run's summary: the best epoch's (by val MRR) val MRR
    and hits@10, EdgeBank's val MRR and hits@10 on the same negatives."""
    eb = edgebank or {}
    nan = float("nan")
    return {"eval_protocol": "tgb", "val_mrr": best.get("val_mrr", nan),
            f"val_hits@{K_VALUE}": best.get(f"val_hits@{K_VALUE}", nan),
            f"test_hits@{K_VALUE}": best.get(f"test_hits@{K_VALUE}", nan),
            "edgebank_val_mrr": eb.get("val_mrr", nan),
            f"edgebank_test_hits@{K_VALUE}": eb.get(f"test_hits@{K_VALUE}", nan)}


def log_result(out: Mapping[str, Any]) -> None:
    """The TGB line of the run's end: test MRR and hits@10 beside EdgeBank's."""
    log.info("TGB protocol (%s's negatives; selected on val MRR %.4f): test MRR %.4f "
             "(EdgeBank %.4f)  hits@%d %.4f (EdgeBank %.4f)", out["data"], out["val_mrr"],
             out["test_mrr"], out.get("edgebank_test_mrr", float("nan")), K_VALUE,
             out[f"test_hits@{K_VALUE}"], out.get(f"edgebank_test_hits@{K_VALUE}", float("nan")))
    if out["test_mrr"] < out.get("edgebank_test_mrr", float("-inf")):
        log.warning("the model's test MRR %.4f is below EdgeBank's %.4f on TGB's negatives",
                    out["test_mrr"], out["edgebank_test_mrr"])


__all__ = ["PROTOCOLS", "TGBProtocol", "TGBTap", "tgb_dataset_name", "csv_fields",
           "summary_fields", "log_result"]

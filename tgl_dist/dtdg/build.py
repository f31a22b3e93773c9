"""``build_model``: a snapshot model by name, from argparse args or keyword arguments.

Known names (aliases in brackets): ``gcn``, ``evolvegcn-o`` (``egcn_o``, ``evolvegcno``),
``evolvegcn-h`` (``egcn_h``, ``evolvegcnh``), ``tgcn`` (``t-gcn``), ``gconvgru``
(``gcrn``). Configs build models; models never read configs.
"""
from __future__ import annotations

from argparse import Namespace
from typing import Any, Callable, Dict, Mapping, Union

from tgl_dist.dist import PartitionBook
from tgl_dist.dtdg.models import GCN, TGCN, EvolveGCNH, EvolveGCNO, GConvGRU, SnapshotModel
from tgl_dist.nn.dist_embedding import DistEmbedding

MODELS: Dict[str, Callable[..., SnapshotModel]] = {
    "gcn": lambda g, a: GCN(g, a["in_dim"], a["hidden_dims"], a["activation"], use_weight=a["use_weight"]),
    "evolvegcn-o": lambda g, a: EvolveGCNO(g, a["in_dim"], a["hidden_dims"], a["activation"],
                                           use_weight=a["use_weight"]),
    "evolvegcn-h": lambda g, a: EvolveGCNH(g, a["in_dim"], a["hidden_dims"], a["activation"],
                                           use_weight=a["use_weight"]),
    "tgcn": lambda g, a: TGCN(g, a["in_dim"], a["hidden_dims"][-1], use_weight=a["use_weight"]),
    "gconvgru": lambda g, a: GConvGRU(g, a["in_dim"], a["hidden_dims"][-1], K=a["K"],
                                      use_weight=a["use_weight"]),
}
ALIASES = {"egcn_o": "evolvegcn-o", "egcn-o": "evolvegcn-o", "evolvegcno": "evolvegcn-o",
           "egcn_h": "evolvegcn-h", "egcn-h": "evolvegcn-h", "evolvegcnh": "evolvegcn-h",
           "t-gcn": "tgcn", "gcrn": "gconvgru", "sync_gcn": "gcn"}
DEFAULTS = {"hidden_dim": 32, "num_layers": 2, "activation": "relu", "use_weight": True, "K": 2}


def model_names() -> list:
    return sorted(MODELS)


def canonical_name(name: str) -> str:
    key = name.lower().replace(" ", "")
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise ValueError(f"unknown DTDG model {name!r}; known: {model_names()} "
                         f"(aliases: {sorted(ALIASES)})")
    return key


def build_model(args: Union[Namespace, Mapping[str, Any], None], graph, group=None,
                **kwargs) -> SnapshotModel:
    """Build the model ``args.model`` on this rank's graph.

    Args:
        args: an argparse ``Namespace`` or a dict with ``model`` and optionally
            ``hidden_dim`` (32), ``num_layers`` (2), ``hidden_dims`` (overrides both),
            ``activation`` ('relu'), ``use_weight`` (True), ``K`` (2, GConvGRU),
            ``in_dim`` (default: the graph's feature size; 0 on a featureless graph),
            ``node_embedding`` (0 = none, the default): D > 0 appends a learnable
            per-node input of size D (a :class:`tgl_dist.nn.DistEmbedding` sharded by
            the graph's partition, trained by the sparse optimizer of
            :func:`tgl_dist.ctdg.build_optimizer`); the model's input is then
            ``in_dim + D`` wide.
        graph: the rank's ``DistGraph``.
        group: must be the graph's group (the route lives on the graph); checked.
        kwargs: override ``args``.
    """
    a: Dict[str, Any] = dict(DEFAULTS)
    if isinstance(args, Namespace):
        a.update({k: v for k, v in vars(args).items() if v is not None})
    elif args is not None:
        a.update({k: v for k, v in dict(args).items() if v is not None})
    a.update(kwargs)
    if "model" not in a:
        raise ValueError(f"build_model needs a model name (args.model); known: {model_names()}")
    if group is not None and graph.group is not None and group is not graph.group:
        raise ValueError("build_model: group differs from the group the graph was loaded with")
    name = canonical_name(str(a["model"]))
    if "hidden_dims" not in a:
        a["hidden_dims"] = [int(a["hidden_dim"])] * int(a["num_layers"])
    emb_dim = int(a.get("node_embedding") or 0)
    if emb_dim < 0:
        raise ValueError(f"node_embedding must be >= 0 (0 = none), got {emb_dim}")
    if "in_dim" not in a:
        x = graph.node().get("x")
        if x is None and not emb_dim:
            raise ValueError("the graph has no node()['x']; pass in_dim= and x= to the model, "
                             "or give it a learnable input with node_embedding=D")
        a["in_dim"] = 0 if x is None else (int(x.size(-1)) if x.dim() == 3 else 1)
    feat_dim = int(a["in_dim"])
    a["in_dim"] = feat_dim + emb_dim
    model = MODELS[name](graph, a)
    if emb_dim:
        model.set_node_embedding(node_embedding_table(graph, emb_dim))
    model.model_name = name
    return model


def node_embedding_table(graph, dim: int, name: str = "node_embedding") -> DistEmbedding:
    """A learnable ``[N, dim]`` node table sharded like ``graph`` (each rank: its owned rows).

    Built with ``grad_reduction='sum'``: the DTDG losses are normalised by global counts
    and the trainer sums gradients over ranks, so the owner's sum of the ranks' gradient
    rows is the 1-process gradient.
    """
    book = PartitionBook(graph.owner, num_parts=graph.world_size)
    return DistEmbedding(graph.num_nodes, dim, book, name, group=graph.group,
                         grad_reduction="sum")

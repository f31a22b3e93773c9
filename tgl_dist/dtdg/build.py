"""``build_model``: a snapshot model by name, from argparse args or keyword arguments.

Known names (aliases in brackets): ``gcn``, ``evolvegcn-o`` (``egcn_o``, ``evolvegcno``),
``evolvegcn-h`` (``egcn_h``, ``evolvegcnh``), ``tgcn`` (``t-gcn``), ``gconvgru``
(``gcrn``). Configs build models; models never read configs.
"""
from __future__ import annotations

from argparse import Namespace
from typing import Any, Callable, Dict, Mapping, Union

from tgl_dist.dtdg.models import GCN, TGCN, EvolveGCNH, EvolveGCNO, GConvGRU, SnapshotModel

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
            ``in_dim`` (default: the graph's feature size).
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
    if "in_dim" not in a:
        x = graph.node().get("x")
        if x is None:
            raise ValueError("the graph has no node()['x']; pass in_dim= and x= to the model")
        a["in_dim"] = int(x.size(-1)) if x.dim() == 3 else 1
    model = MODELS[name](graph, a)
    model.model_name = name
    return model

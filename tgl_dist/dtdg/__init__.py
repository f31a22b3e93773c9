"""Discrete-time dynamic graphs: snapshot data, partitions, the halo route, sync GNN models, training.

Flow::

    g = load_pgt_json("twitter_tennis_rg17.json")           # or GraphData(...) / from_temporal(...)
    path = g.save_partition(root, num_parts=P, algorithm="metis")
    graph = get_graph(path, group)                           # this rank's DistGraph
    model = build_model({"model": "evolvegcn-o"}, graph, group)
    task = LinkPrediction(graph, dim=32)
    result = Trainer(model, task, Splitter.from_graph(graph, hist_len=10)).fit()
"""
from tgl_dist.dtdg.adjacency import SnapshotAdj
from tgl_dist.dtdg.build import build_model, model_names
from tgl_dist.dtdg.dist_graph import DistGraph, get_graph
from tgl_dist.dtdg.graph_data import GraphData, Snapshot
from tgl_dist.dtdg.layers import MatGRUCell, SnapshotGCNConv, TopKSummarize
from tgl_dist.dtdg.loaders import (degree_features, from_temporal, load_dtdg, load_pgt_json,
                                    load_snapshot_csv, past_signal_features)
from tgl_dist.dtdg.models import GCN, TGCN, EvolveGCNH, EvolveGCNO, GConvGRU, SnapshotModel
from tgl_dist.dtdg.partition import ALGORITHMS, build_parts, save_partition
from tgl_dist.dtdg.route import Route
from tgl_dist.dtdg.splitter import Splitter
from tgl_dist.dtdg.tasks import LinkPrediction, NodeRegression, build_task
from tgl_dist.dtdg.trainer import Trainer

__all__ = ["GraphData", "Snapshot", "load_pgt_json", "load_snapshot_csv", "load_dtdg", "degree_features", "past_signal_features", "from_temporal", "save_partition", "build_parts",
           "ALGORITHMS", "get_graph", "DistGraph", "Route", "SnapshotAdj", "SnapshotGCNConv",
           "MatGRUCell", "TopKSummarize", "SnapshotModel", "GCN", "EvolveGCNO", "EvolveGCNH", "TGCN",
           "GConvGRU", "build_model", "model_names", "Splitter", "LinkPrediction", "NodeRegression",
           "build_task", "Trainer"]

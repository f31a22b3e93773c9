"""Evaluation over the whole set (gathered across ranks), early stopping, TGB's
``Evaluator`` and its one-vs-many ranks, and the EdgeBank baseline."""
from tgl_dist.metrics.edgebank import EdgeBank, EdgeBankMetrics, evaluate_edgebank
from tgl_dist.metrics.ranking import (EarlyStopMonitor, LinkPredMetrics, NonFiniteScoresError,
                                      average_precision, mrr, roc_auc)
from tgl_dist.metrics.tgb import Evaluator, TGBMetrics, mrr_hits_from_ranks, tgb_ranks

__all__ = ["LinkPredMetrics", "EarlyStopMonitor", "NonFiniteScoresError", "average_precision",
           "roc_auc", "mrr", "Evaluator", "TGBMetrics", "tgb_ranks", "mrr_hits_from_ranks",
           "EdgeBank", "EdgeBankMetrics", "evaluate_edgebank"]

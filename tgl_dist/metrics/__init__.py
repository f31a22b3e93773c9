"""Evaluation over the whole set (gathered across ranks), and early stopping."""
from tgl_dist.metrics.ranking import (EarlyStopMonitor, LinkPredMetrics, NonFiniteScoresError,
                                      average_precision, mrr, roc_auc)

__all__ = ["LinkPredMetrics", "EarlyStopMonitor", "NonFiniteScoresError", "average_precision",
           "roc_auc", "mrr"]

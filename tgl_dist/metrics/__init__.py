"""Evaluation over the whole set (gathered across ranks), and early stopping."""
from tgl_dist.metrics.ranking import (EarlyStopMonitor, LinkPredMetrics, average_precision, roc_auc,
                                      mrr)

__all__ = ["LinkPredMetrics", "EarlyStopMonitor", "average_precision", "roc_auc", "mrr"]

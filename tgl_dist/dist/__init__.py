"""Collective exchanges: partition book, count/request/payload all-to-all, differentiable all-to-all."""
from tgl_dist.dist.book import PartitionBook
from tgl_dist.dist.exchange import (AllToAllV, Plan, all_gather_v, barrier, all_reduce_, all_to_all_v,
                                    broadcast_object, fetch_rows, push_rows, world)

__all__ = ["PartitionBook", "Plan", "AllToAllV", "fetch_rows", "push_rows", "all_to_all_v",
           "all_reduce_", "all_gather_v", "broadcast_object", "world", "barrier"]

"""Collectives: partition book, count/request/payload all-to-all, differentiable all-to-all, data parallelism."""
from tgl_dist.dist.book import EventBook, PartitionBook, directory_size, hash_owner
from tgl_dist.dist.exchange import (AllToAllV, Pending, Plan, all_gather_object, all_gather_v, all_reduce_,
                                    all_reduce_async, all_to_all_v, barrier, broadcast_object,
                                    comm_device, fetch_rows, new_group, push_rows, push_then_fetch,
                                    world)
from tgl_dist.dist.parallel import (PendingGradients, all_reduce_gradients, broadcast_parameters,
                                    reduce_gradients)

__all__ = ["PartitionBook", "EventBook", "directory_size", "hash_owner", "Plan", "Pending", "AllToAllV", "fetch_rows", "push_rows", "push_then_fetch", "all_to_all_v",
           "all_reduce_", "all_reduce_async", "all_gather_v", "all_gather_object", "broadcast_object", "world", "barrier", "comm_device", "new_group",
           "all_reduce_gradients", "broadcast_parameters", "reduce_gradients", "PendingGradients"]

"""Counter-based random numbers: a deterministic function of (seed, key, counter).

The samplers draw their randomness from a SplitMix64 hash of integer keys (node id,
bit pattern of the query time, event id, ...) instead of a stateful generator, so a
draw does not depend on which rank makes it, in which order, or in how many pieces
the work is split. That is what makes replicated and partitioned sampling, and one
and two processes, return the same samples.

All arithmetic is on int64 tensors and wraps around modulo 2**64 like the
reference SplitMix64 (logical right shifts are emulated with masks).
"""
from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_C2 = 0x94D049BB133111EB - (1 << 64)
GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_M = [(1 << (64 - s)) - 1 for s in range(64)]


def wrap64(x: int) -> int:
    """A Python int reduced to the signed int64 range (two's complement)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= (1 << 63) else x


def _srl(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 values."""
    return (x >> s) & _M[s]


def mix64(x: Tensor) -> Tensor:
    """SplitMix64 finaliser of int64 tensor ``x`` (elementwise, wraps modulo 2**64)."""
    x = x ^ _srl(x, 30)
    x = x * _C1
    x = x ^ _srl(x, 27)
    x = x * _C2
    return x ^ _srl(x, 31)


_U64 = (1 << 64) - 1
_C1U, _C2U = _C1 & _U64, _C2 & _U64


def mix64_int(x: int) -> int:
    """:func:`mix64` of one value in Python integers (the same bits, as a signed int64)."""
    x &= _U64
    x ^= x >> 30
    x = (x * _C1U) & _U64
    x ^= x >> 27
    x = (x * _C2U) & _U64
    return wrap64(x ^ (x >> 31))


def seed_state(seed: int) -> int:
    """The hash state :func:`hash_keys` starts from: ``mix64(seed + GOLDEN)`` (signed int64)."""
    return mix64_int(wrap64(int(seed)) + GOLDEN)


def hash_keys(seed: int, *keys: Union[int, Tensor]) -> Tensor:
    """Hash a seed and any number of broadcastable int64 keys (tensors or Python ints) to
    int64. Leading integer keys are hashed in Python (a per-step scalar key costs ~1 us
    instead of ~100 us of one-element tensor operations); the result is the same."""
    h = seed_state(seed)
    i = 0
    while i < len(keys) and isinstance(keys[i], int):
        h = mix64_int((h ^ wrap64(keys[i])) + GOLDEN)
        i += 1
    if i == len(keys):
        return torch.tensor(h, dtype=torch.long)
    for k in keys[i:]:
        h = mix64((k.to(torch.long) ^ h) + GOLDEN)
    return h


def time_bits(t: Tensor) -> Tensor:
    """The float64 bit pattern of times as int64 (exact key for a query time)."""
    return t.to(torch.float64).contiguous().view(torch.long)


def uniform_below(h: Tensor, n: Tensor) -> Tensor:
    """Integers in ``[0, n)`` from hashes ``h`` (63 random bits modulo ``n``; ``n >= 1``)."""
    return _srl(h, 1) % n


def uniform01(h: Tensor) -> Tensor:
    """Floats in ``[0, 1)`` (float64, 53 random bits) from hashes ``h``."""
    return _srl(h, 11).to(torch.float64) * (1.0 / (1 << 53))

"""Compare the committed versions of two checkpoint folders bitwise (timings and args excluded)."""
import math
from pathlib import Path

import torch

TIMING = {"epoch_s", "train_events_per_s", "speeds", "cpu_speeds", "args", "seconds",
          "snapshots_per_s"}


def committed(folder):
    folder = Path(folder)
    v = int((folder / "VERSION").read_text())
    d = folder / f"v{v:06d}"
    return {p.name: torch.load(p, weights_only=False) for p in sorted(d.glob("*.pt"))}


def diff(a, b, path="", out=None):
    """Paths where ``a`` and ``b`` differ (tensors bitwise, floats exactly, NaN == NaN)."""
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            out.append(f"{path}: keys {sorted(set(a) ^ set(b), key=str)}")
        for k in set(a) & set(b):
            if k not in TIMING:
                diff(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out)
    elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            if not (a.shape == b.shape and a.is_floating_point() and
                    torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0))):
                out.append(f"{path}: tensors differ")
    elif isinstance(a, float) and isinstance(b, float):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            out.append(f"{path}: {a!r} != {b!r}")
    elif type(a).__module__ == "numpy" or type(b).__module__ == "numpy":
        import numpy as np
        if not np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)):
            out.append(f"{path}: arrays differ")
    elif a != b:
        out.append(f"{path}: {str(a)[:60]!r} != {str(b)[:60]!r}")
    return out


def checkpoint_diff(a, b):
    """Differences between the committed versions of folders ``a`` and ``b``."""
    ca, cb = committed(a), committed(b)
    return diff(ca, cb)[:20]

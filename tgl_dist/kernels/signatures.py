"""Each kernel's C signatures, declared once: parsed from the C source's own definitions.

Why parse the C (not a Python table beside it): the definition in the ``.c`` file is the
one declaration the compiler already checks against the function's body, so a second
copy in Python could only drift from it. The grammar the sources keep to is small: an
exported function is a non-``static`` definition starting at column 0 whose name starts
with ``tgl_``, returning ``void``, ``int``, ``int64_t``, ``uint64_t``, ``float`` or
``double``; each argument is one of those scalar types or any pointer (``T *name``,
``T *const *name``: passed as an address, ``None`` for ``NULL``). Anything else raises at
load time, and ``tests/kernels`` parses every library, so a signature the parser does
not understand fails a test rather than a call.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple

SCALARS: Dict[str, Any] = {"int": ctypes.c_int, "int64_t": ctypes.c_int64,
                           "uint64_t": ctypes.c_uint64, "float": ctypes.c_float,
                           "double": ctypes.c_double}
_DEF = re.compile(r"^(?!static\b)([A-Za-z_][A-Za-z0-9_ ]*?)\s+(tgl_[A-Za-z0-9_]+)\s*\(([^)]*)\)\s*\{",
                  re.M)


@dataclass(frozen=True)
class Signature:
    """One exported C function: ``restype`` (``'void'`` or a scalar type) and its
    arguments as ``(name, type)`` with type a scalar type or ``'ptr'``."""
    name: str
    restype: str
    args: Tuple[Tuple[str, str], ...]

    def ctypes(self) -> Tuple[Any, list]:
        """``(restype, argtypes)`` for a ctypes function."""
        res = None if self.restype == "void" else SCALARS[self.restype]
        return res, [ctypes.c_void_p if t == "ptr" else SCALARS[t] for _, t in self.args]


def _arg(fn: str, text: str) -> Tuple[str, str]:
    text = " ".join(text.split())
    m = re.fullmatch(r"(.*?)([A-Za-z_][A-Za-z0-9_]*)", text)
    if not m:
        raise ValueError(f"{fn}: cannot read the argument {text!r}")
    kind, name = m.group(1), m.group(2)
    if "*" in kind:
        return name, "ptr"
    kind = kind.replace("const", "").strip()
    if kind not in SCALARS:
        raise ValueError(f"{fn}: argument {name!r} has type {kind!r}, not one of "
                         f"{sorted(SCALARS)} or a pointer")
    return name, kind


def parse(source: Path) -> Dict[str, Signature]:
    """The exported functions of a kernel source: ``{name: Signature}`` in source order."""
    out: Dict[str, Signature] = {}
    for m in _DEF.finditer(Path(source).read_text()):
        restype, name, args = " ".join(m.group(1).split()), m.group(2), m.group(3).strip()
        if restype != "void" and restype not in SCALARS:
            raise ValueError(f"{name}: return type {restype!r} is not void or one of {sorted(SCALARS)}")
        parts = [] if args in ("", "void") else [_arg(name, a) for a in args.split(",")]
        out[name] = Signature(name, restype, tuple(parts))
    return out

"""The package's error types: one base class, and input errors that say where."""
from __future__ import annotations

from typing import Optional


class TGLDistError(Exception):
    """Base class of every error tgl_dist raises on purpose."""


class DataFormatError(TGLDistError, ValueError):
    """Bad input data: names the file, the line (or row) and the field.

    Args:
        path: file that holds the bad input.
        message: what was wrong and what was expected.
        line: 1-based line number in the file (or row index for binary arrays).
        field: column or key name.
    """

    def __init__(self, path, message: str, line: Optional[int] = None,
                 field: Optional[str] = None):
        self.path = str(path)
        self.line = line
        self.field = field
        where = self.path
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {message}")


class PartitionError(TGLDistError, ValueError):
    """A partition on disk that cannot be used (wrong world size, corrupt, unknown format)."""


class PeerFailureError(TGLDistError, RuntimeError):
    """A collective failed or timed out because another rank died or stopped."""

"""Shared parsing helpers for the format loaders: fast table reading, id remapping, checks.

Every text loader goes through :func:`read_table`: it reads the whole file (gzip when
the file starts with the gzip magic), drops comment and blank lines, normalises the
separators (comma, tab, space, any mix), checks the number of fields on every line with
one vectorised pass and converts all numbers with a single ``numpy`` call. Only when that
fast path fails does it scan line by line to name the exact line and field that is wrong,
so a bad row is always reported and never dropped.

Shapes:
    R: number of data rows (events), C: number of columns.
"""
from __future__ import annotations

import gzip
import io
import math
import re
from pathlib import Path
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from tgl_dist.errors import DataFormatError, TGLDistError

PathLike = Union[str, Path]

_SPACE = np.frombuffer(b" ", dtype=np.uint8)[0]
_NEWLINE = np.frombuffer(b"\n", dtype=np.uint8)[0]
_BOM = b"\xef\xbb\xbf"      # UTF-8 byte order mark some editors put at the start of a file


class DatasetNotFoundError(TGLDistError, FileNotFoundError):
    """A data file or dataset is absent (and could not be downloaded): the message says
    which file to put where."""


def read_bytes(path: PathLike) -> bytes:
    """The file's bytes, decompressed when it is gzip (by magic number, not by name)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"no such file: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataFormatError(path, f"corrupt or truncated gzip file ({exc})") from None
    return raw[len(_BOM):] if raw.startswith(_BOM) else raw


def head_lines(path: PathLike, n: int) -> List[str]:
    """The first ``n`` lines of a (possibly gzip) text file, without reading all of it."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"no such file: {path}")
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    out: List[str] = []
    with opener(path, "rb") as f:
        for raw in f:
            if not out and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            out.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
            if len(out) >= n:
                break
    return out


def stem(path: PathLike) -> str:
    """File name without ``.gz``/``.txt``/``.csv``/``.tsv`` extensions (the default dataset name)."""
    n = Path(path).name
    for ext in (".gz", ".txt", ".csv", ".tsv"):
        if n.endswith(ext):
            n = n[: -len(ext)]
    return n


# exactly the tokens numpy's float reader (``np.fromstring(..., sep=" ")``) accepts: ASCII
# decimals with an optional exponent, inf/infinity, nan; not ``1_000``, non-ASCII digits or
# hex, which Python's ``float()`` partly accepts
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?"
                     r"|nan(?:\([0-9A-Za-z_]*\)?)?)", re.IGNORECASE | re.ASCII)


def _is_number(token: str) -> bool:
    """Whether the text parser reads ``token`` as a number."""
    return _NUMBER.fullmatch(token) is not None


class Table:
    """A numeric table read from a text file.

    Attributes:
        values: the numbers, shape ``[R, C]``, float64.
        lines: 1-based file line number of each row, shape ``[R]``, int64.
        header: the header's field names, or ``None`` when the file has no header.
        path: the file.
        header_line: 1-based file line number of the header (``None`` without one).
    """

    def __init__(self, values: np.ndarray, lines: np.ndarray, header: Optional[List[str]], path: Path,
                 header_line: Optional[int] = None):
        self.values, self.lines, self.header, self.path = values, lines, header, path
        self.header_line = header_line

    @property
    def num_rows(self) -> int:
        return int(self.values.shape[0])

    def error(self, row: int, field: str, message: str) -> DataFormatError:
        """An error naming the file line of data row ``row`` and the field."""
        return DataFormatError(self.path, message, line=int(self.lines[row]), field=field)


def read_table(path: PathLike, *, names: Sequence[str], min_cols: int, max_cols: Optional[int] = None,
               comments: str = "#%", header: Union[bool, str] = "auto") -> Table:
    """Read a numeric text table, fast, with exact errors.

    Args:
        path: the file (plain or gzip).
        names: field names for the columns (used in error messages; extra columns are
            called ``feature_<k>``).
        min_cols: fewest columns a row may have. max_cols: most (default ``min_cols``;
            ``-1`` for no limit). All rows must have the same number of columns.
        comments: characters that start a comment line (skipped).
        header: ``True`` if the first data line is a header, ``False`` if not, ``"auto"``
            to treat it as a header when none of its fields is a number (a data line with
            one bad field is then reported, not dropped). A UTF-8 byte order mark at the
            start of the file is ignored.

    Returns:
        :class:`Table` with ``values [R, C]`` float64 and the line number of each row.

    Raises:
        DataFormatError: naming the line and field of a row with the wrong number of
            columns (the first missing field, or ``column N (unexpected)`` for the first
            extra one, 1-based) or of a field that is not a number.
    """
    path = Path(path)
    max_cols = min_cols if max_cols is None else max_cols
    raw = read_bytes(path)
    if b"\r" in raw:
        raw = raw.replace(b"\r", b" ")
    rb = np.frombuffer(raw, dtype=np.uint8)
    nl = np.flatnonzero(rb == _NEWLINE)
    line_start = np.concatenate([np.zeros(1, dtype=np.int64), nl + 1])
    line_end = np.concatenate([nl, np.array([rb.size], dtype=np.int64)])  # exclusive
    if line_start[-1] >= rb.size:  # file ends with a newline: no last empty line
        line_start, line_end = line_start[:-1], line_end[:-1]
    n_lines = int(line_start.size)
    first = rb[np.minimum(line_start, max(rb.size - 1, 0))]
    comment = np.isin(first, np.frombuffer(comments.encode(), dtype=np.uint8)) & (line_end > line_start)

    # header: the first line that is neither a comment nor blank (usually within a few lines)
    header_fields: Optional[List[str]] = None
    header_line: Optional[int] = None
    for i in range(n_lines):
        if comment[i] or not raw[line_start[i]:line_end[i]].strip():
            continue
        text0 = raw[line_start[i]:line_end[i]].decode("utf-8", "replace")
        fields = [f.strip() for f in (text0.split(",") if "," in text0 else text0.split())]
        if header is True or (header == "auto" and looks_like_header(fields)):
            header_fields, header_line = fields, i + 1
            comment[i] = True
        break

    def name(c: int) -> str:
        return names[c] if c < len(names) else f"feature_{c - len(names)}"

    def extra(c: int) -> str:
        """The field name of 0-based column ``c`` when no column ``c`` is expected."""
        return f"column {c + 1} (unexpected)"

    # chunks of whole lines, ~_CHUNK bytes each, bound the temporary memory
    cuts = np.unique(np.searchsorted(line_start, np.arange(0, max(rb.size, 1), _CHUNK)))
    bounds = np.append(cuts, n_lines).tolist()
    C: Optional[int] = None
    first_line = 0
    values, lines = [], []
    for l0, l1 in zip(bounds[:-1], bounds[1:]):
        if l1 <= l0:
            continue
        s0 = int(line_start[l0])
        seg = raw[s0:int(line_end[l1 - 1])]
        _refuse_empty_fields(path, seg, line_start[l0:l1] - s0, comment[l0:l1], l0, name)
        seg = seg.replace(b",", b" ").replace(b"\t", b" ")
        ncols = _count_fields(seg, nl[l0:l1 - 1] - s0, l1 - l0)
        com = comment[l0:l1]
        data = np.flatnonzero(~com & (ncols > 0))
        if data.size == 0:
            continue
        if C is None:
            C, first_line = int(ncols[data[0]]), l0 + int(data[0]) + 1
            expect = (f"{min_cols}" if max_cols == min_cols else
                      f"{min_cols} or more" if max_cols < 0 else f"{min_cols} to {max_cols}")
            if C < min_cols or (max_cols >= 0 and C > max_cols):
                raise DataFormatError(path, f"expected {expect} fields ({', '.join(names)}), found {C}",
                                      line=first_line, field=name(C) if C < min_cols else extra(max_cols))
        bad = np.flatnonzero(ncols[data] != C)
        if bad.size:
            r = int(data[bad[0]])
            got = int(ncols[r])
            what = "missing" if got < C else "extra fields"
            raise DataFormatError(path, f"expected {C} fields like line {first_line}, found {got} ({what})",
                                  line=l0 + r + 1, field=name(got) if got < C else extra(C))
        drop = np.flatnonzero(com)
        if drop.size == 0:
            body = seg
        else:  # the bytes of the kept lines: slices between dropped (comment/header) lines
            cut_s = np.concatenate([[0], line_end[l0 + drop] - s0]).tolist()
            cut_e = np.concatenate([line_start[l0 + drop] - s0, [len(seg)]]).tolist()
            body = b" ".join(seg[a:e] for a, e in zip(cut_s, cut_e) if e > a)
        flat = _parse_numbers(body)
        if flat is None or flat.size != data.size * C:
            _scan_for_bad_field(path, raw, line_start[l0 + data], line_end[l0 + data], name)
            raise DataFormatError(path, "could not parse the numbers (no single bad field found)")
        values.append(flat.reshape(-1, C))
        lines.append(l0 + data.astype(np.int64) + 1)
    if C is None:
        raise DataFormatError(path, "the file holds no data rows")
    vals = values[0] if len(values) == 1 else np.concatenate(values)
    return Table(vals, lines[0] if len(lines) == 1 else np.concatenate(lines), header_fields, path,
                 header_line)


def looks_like_header(fields: Sequence[str]) -> bool:
    """A line is a header when none of its (non-empty) fields is a number: a data line
    with one mistyped field (``1,2,5,1O0``) is data, and its bad field gets reported."""
    return not any(_is_number(f) for f in fields if f)


_CHUNK = 16 << 20


# an empty comma-separated field: a leading comma, two commas with only blanks between
# them, or a trailing comma (carriage returns are blanks by then)
_EMPTY_FIELD = re.compile(rb"(?m)^[ \t]*,|,[ \t]*(?=,|$)")
_COMMA, _LF, _SP, _TAB = (np.uint8(ord(c)) for c in ",\n \t")


def _refuse_empty_fields(path: Path, seg: bytes, starts: np.ndarray, comment: np.ndarray,
                         l0: int, name) -> None:
    """Raise for the first empty comma-separated field (``1,,3``) on a data line of ``seg``
    (lines ``l0 ..`` of the file starting at offsets ``starts`` in ``seg``; ``comment``
    marks comment and header lines). Counting fields alone misses one when the line also
    has an extra field, and the values after it would shift. Vectorised over the commas
    (a regex scan only when a comma has a blank beside it, as in ``1, 2, 3``)."""
    if b"," not in seg:
        return
    b = np.frombuffer(seg, dtype=np.uint8)
    c = np.flatnonzero(b == _COMMA)
    nxt = b[np.minimum(c + 1, b.size - 1)]
    prv = b[np.maximum(c - 1, 0)]
    last, first = c + 1 >= b.size, c == 0
    if ((((nxt == _SP) | (nxt == _TAB)) & ~last).any()
            or (((prv == _SP) | (prv == _TAB)) & ~first).any()):
        hits = np.array([m.start() for m in _EMPTY_FIELD.finditer(seg)], dtype=np.int64)
    else:
        hits = c[last | (nxt == _COMMA) | (nxt == _LF) | first | (prv == _LF)]
    if hits.size == 0:
        return
    rows = np.searchsorted(starts, hits, side="right") - 1
    rows = rows[~comment[rows]]
    if rows.size == 0:
        return
    i = int(rows[0])
    end = int(starts[i + 1]) - 1 if i + 1 < starts.size else len(seg)
    line = seg[int(starts[i]):end].decode("utf-8", "replace")
    k = next(k for k, f in enumerate(line.split(","), 1) if not f.strip())
    raise DataFormatError(path, f"field {k} is empty; expected a number", line=l0 + i + 1,
                          field=name(k - 1))


def _count_fields(seg: bytes, nl: np.ndarray, n: int) -> np.ndarray:
    """Fields on each of the ``n`` lines of ``seg`` (separators already spaces).

    Args:
        seg: the lines' bytes; nl: positions of its ``n - 1`` newlines.

    Returns:
        field counts, shape ``[n]``, int64.
    """
    b = np.frombuffer(seg, dtype=np.uint8)
    is_sep = (b == _SPACE) | (b == _NEWLINE)
    tok = ~is_sep
    tok[1:] &= is_sep[:-1]  # a field starts at a non-space after a space/newline/segment start
    return np.bincount(np.searchsorted(nl, np.flatnonzero(tok)), minlength=n)[:n]


_INT_BYTES = np.zeros(256, dtype=bool)
_INT_BYTES[np.frombuffer(b"0123456789+- \n", dtype=np.uint8)] = True


def _parse_numbers(body: bytes) -> Optional[np.ndarray]:
    """All numbers of ``body`` (whitespace separated) as a flat float64 array, or ``None``.

    Integer-only text (the usual edge list) goes through numpy's C integer reader, which
    is several times faster than its float reader; anything else through
    ``np.fromstring``. ``None`` means some field is not a number.
    """
    if _INT_BYTES[np.frombuffer(body, dtype=np.uint8)].all():
        try:
            return np.loadtxt(io.BytesIO(body), dtype=np.int64, ndmin=1).ravel().astype(np.float64)
        except (ValueError, OverflowError):
            pass                     # e.g. an id beyond int64: the float reader below takes it
    try:
        return np.fromstring(body, dtype=np.float64, sep=" ")  # text mode: one C-level pass
    except ValueError:
        return None


def _scan_for_bad_field(path: Path, raw: bytes, starts: np.ndarray, ends: np.ndarray, name) -> None:
    """Slow path: find the first field that is not a number and raise for it.

    Splits the bytes as the fast path does (comma, tab and space only) and accepts exactly
    what numpy's reader accepts (:func:`_is_number`), so the field that made it fail is found.
    """
    for s, e in zip(starts.tolist(), ends.tolist()):
        toks = raw[s:e].replace(b",", b" ").replace(b"\t", b" ").split(b" ")
        fields = [t.decode("utf-8", "replace") for t in toks if t]
        for c, tok in enumerate(fields):
            if not _is_number(tok):
                lineno = raw.count(b"\n", 0, s) + 1
                hint = ("" if any(map(_is_number, fields)) else
                        " (a header line? this format takes none here: delete the line, or "
                        "start it with '#' to keep it as a comment)")
                raise DataFormatError(path, f"{tok!r} is not a number{hint}", line=lineno,
                                      field=name(c)) from None


# ---------------------------------------------------------------- column checks
def node_ids(table: Table, col: int, field: str) -> np.ndarray:
    """Column ``col`` as int64 node ids; each must be a non-negative integer.

    Returns:
        ids, shape ``[R]``, int64.
    """
    x = table.values[:, col]
    bad = ~np.isfinite(x) | (x < 0) | (x != np.floor(x))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise table.error(r, field, f"node id must be a non-negative integer, got {float(x[r])!r}")
    if x.size and x.max() >= 2 ** 53:
        r = int(np.argmax(x))
        raise table.error(r, field, f"node id {float(x[r])!r} is too large to read exactly")
    return x.astype(np.int64)


def finite_values(table: Table, col: int, field: str, what: str) -> np.ndarray:
    """Column ``col`` as float64 values (a weight, a rating); NaN or infinite ones are
    errors naming ``what``.

    Returns:
        values, shape ``[R]``, float64.
    """
    x = table.values[:, col]
    bad = ~np.isfinite(x)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise table.error(r, field, f"{what} must be a finite number, got {float(x[r])!r}")
    return x


def int_labels(table: Table, col: int, field: str, what: str) -> np.ndarray:
    """Column ``col`` as int64 class labels (JODIE state labels, DyGLib ``label``); a NaN,
    infinite, fractional or out-of-int64 label is an error naming ``what``.

    Returns:
        labels, shape ``[R]``, int64.
    """
    x = table.values[:, col]
    bad = ~np.isfinite(x) | (x != np.floor(x)) | (np.abs(x) >= 2.0 ** 63)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise table.error(r, field, f"{what} must be an integer below 2^63 in size, "
                                    f"got {float(x[r])!r}")
    return x.astype(np.int64)


def check_finite(x: np.ndarray, path: PathLike, what: str, lines: Optional[np.ndarray] = None,
                 row_offset: int = 0, field=None) -> None:
    """Raise for the first NaN or infinite value of the features ``x`` (shape ``[R, F]``).

    One vectorised test; the bad row is located only on failure. ``lines`` maps rows to
    file lines; without it the error names the row (``row_offset`` + index). ``field(c)``
    names column ``c`` (default ``column <c>``, 0-based).
    """
    ok = np.isfinite(x)
    if ok.all():
        return
    ok = ok.reshape(ok.shape[0], -1)
    r = int(np.flatnonzero(~ok.all(axis=1))[0])
    c = int(np.flatnonzero(~ok[r])[0])
    where = int(lines[r]) if lines is not None else r + row_offset
    got = float(x.reshape(x.shape[0], -1)[r, c])
    raise DataFormatError(path, f"{what} must be finite numbers, got {got!r}", line=where,
                          field=field(c) if field is not None else f"column {c}")


def timestamps(table: Table, col: int, field: str) -> np.ndarray:
    """Column ``col`` as event times; NaN, infinite or negative times are errors.

    Returns:
        times, shape ``[R]``, float64.
    """
    x = table.values[:, col]
    check_times(x, table.path, lines=table.lines, field=field)
    return x


def check_times(t: np.ndarray, path: PathLike, lines: Optional[np.ndarray] = None,
                field: str = "t", row_offset: int = 0) -> None:
    """Raise for the first NaN, infinite or negative time in ``t`` (shape ``[R]``).

    ``lines`` maps rows to file lines; without it the error names the row
    (``row_offset`` + index).
    """
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        what = "NaN" if math.isnan(t[r]) else "infinite" if math.isinf(t[r]) else "negative"
        where = int(lines[r]) if lines is not None else r + row_offset
        raise DataFormatError(path, f"timestamp is {what} ({float(t[r])!r}); times must be finite and >= 0",
                              line=where, field=field)


def remap_nodes(src: np.ndarray, dst: np.ndarray) -> Tuple[Tensor, Tensor, Tensor]:
    """Remap non-negative integer ids to ``0..N-1``, keeping their order.

    Uses a dense presence table (no sort) when the largest id is not much larger than
    the number of ids, else ``np.unique``; both give the same result.

    Returns:
        ``(src, dst, node_map)``: new ids ``[E]`` each, and ``node_map [N]`` holding the
        original id of each new id (sorted ascending).
    """
    E = src.shape[0]
    both = np.concatenate([src, dst])
    top = int(both.max()) if both.size else -1
    if top < 4 * both.size + (1 << 20):
        present = np.zeros(top + 1, dtype=bool)
        present[both] = True
        uniq = np.flatnonzero(present)
        new_id = np.cumsum(present, dtype=np.int64) - 1
        inv = new_id[both]
    else:
        uniq, inv = np.unique(both, return_inverse=True)
    return (torch.from_numpy(inv[:E].astype(np.int64)), torch.from_numpy(inv[E:].astype(np.int64)),
            torch.from_numpy(uniq.astype(np.int64)))


def require_keys(obj: Mapping, keys: Iterable[str], path: PathLike, where: Optional[str] = None) -> None:
    """Raise a :class:`DataFormatError` naming the first key of ``keys`` missing in ``obj``.

    Args:
        obj: a parsed JSON object (or any mapping).
        keys: keys that must be present.
        path: the file ``obj`` was read from (for the message).
        where: optional location inside the file, e.g. ``"snapshot 3"`` (reported as
            the row).

    Example::

        data = json.loads(Path(p).read_text())
        require_keys(data, ["edges", "node_ids", "FX"], p)
    """
    if not isinstance(obj, Mapping):
        raise DataFormatError(path, f"expected a JSON object{' at ' + where if where else ''}, "
                              f"got {type(obj).__name__}")
    for k in keys:
        if k not in obj:
            have = ", ".join(sorted(map(str, obj.keys()))[:12])
            loc = f" in {where}" if where else ""
            raise DataFormatError(path, f"missing required key{loc} (present keys: {have})", field=k)

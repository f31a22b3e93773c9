"""Shared parsing helpers for the format loaders: fast table reading, id remapping, checks.

Every text loader goes through :func:`read_table`: it reads the file (gzip when it
starts with the gzip magic) in blocks of whole lines (:data:`_CHUNK` bytes, a tqdm bar
over the bytes for large files), drops comment and blank lines, normalises the
separators (comma, tab, space, any mix), checks the number of fields on every line with
one vectorised pass per block and converts a block's numbers with a single ``numpy``
call, appending them to one growing table. Only when that fast path fails does it scan
the block line by line to name the exact line and field that is wrong, so a bad row is
always reported and never dropped. Memory: the table (8 bytes a number, float32 for
JODIE features) plus a block's temporaries; never the text of the whole file.
:func:`remap_nodes` and :func:`sort_by_time` then work without copies of the events
beyond one column at a time, so a loader's peak is about twice its final tensors.

Shapes:
    R: number of data rows (events), C: number of columns.
"""
from __future__ import annotations

import gzip
import io
import math
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from tgl_dist.errors import DataFormatError, TGLDistError

if TYPE_CHECKING:
    from tgl_dist.data.temporal import TemporalGraph

PathLike = Union[str, Path]

_SPACE = np.frombuffer(b" ", dtype=np.uint8)[0]
_NEWLINE = np.frombuffer(b"\n", dtype=np.uint8)[0]
_BOM = b"\xef\xbb\xbf"      # UTF-8 byte order mark some editors put at the start of a file


class DatasetNotFoundError(TGLDistError, FileNotFoundError):
    """A data file or dataset is absent (and could not be downloaded): the message says
    which file to put where."""


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


class LineNumbers:
    """The 1-based file line of each data row, stored as runs of consecutive lines (one
    run per stretch without comment or blank lines), so a stream of 10^8 rows costs a few
    bytes, not 8 bytes a row.

    ``lines[r]`` is the line of row ``r`` (an int; an int64 array for an array or slice
    of rows); ``np.asarray(lines)`` gives all of them, shape ``[R]``, int64.
    """

    def __init__(self, starts: np.ndarray, offsets: np.ndarray, n: int):
        self._starts, self._offsets, self._n = starts, offsets, int(n)   # [runs] int64 each

    def __len__(self) -> int:
        return self._n

    def _at(self, rows: np.ndarray) -> np.ndarray:
        return rows + self._offsets[np.searchsorted(self._starts, rows, side="right") - 1]

    def __getitem__(self, r):
        if isinstance(r, (int, np.integer)):
            r = int(r) + (self._n if r < 0 else 0)
            if not 0 <= r < self._n:
                raise IndexError(f"row {r} out of range for {self._n} rows")
            return int(self._at(np.array([r], dtype=np.int64))[0])
        return self._at(np.arange(self._n, dtype=np.int64)[r])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self._at(np.arange(self._n, dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> List[int]:
        return np.asarray(self).tolist()


class Table:
    """A numeric table read from a text file.

    Attributes:
        values: the numbers, shape ``[R, C]``, float64 (with ``features_from=k``: only the
            first ``k`` columns).
        lines: 1-based file line number of each row (:class:`LineNumbers`, ``[R]``).
        header: the header's field names, or ``None`` when the file has no header.
        path: the file.
        header_line: 1-based file line number of the header (``None`` without one).
        features: with ``features_from=k``, columns ``k..C-1`` as float32, shape
            ``[R, C - k]`` (``None`` when the file has no more than ``k`` columns).
        nonfinite: ``(row, column of features, value)`` of the first NaN or infinite
            feature (read as float64), or ``None``.
    """

    def __init__(self, values: np.ndarray, lines, header: Optional[List[str]], path: Path,
                 header_line: Optional[int] = None, features: Optional[np.ndarray] = None,
                 nonfinite: Optional[Tuple[int, int, float]] = None):
        self.values, self.lines, self.header, self.path = values, lines, header, path
        self.header_line = header_line
        self.features, self.nonfinite = features, nonfinite

    @property
    def num_cols(self) -> int:
        """C, the fields on each row (``values`` and ``features`` together)."""
        return int(self.values.shape[1]) + (0 if self.features is None else int(self.features.shape[1]))

    @property
    def num_rows(self) -> int:
        return int(self.values.shape[0])

    def error(self, row: int, field: str, message: str) -> DataFormatError:
        """An error naming the file line of data row ``row`` and the field."""
        return DataFormatError(self.path, message, line=int(self.lines[row]), field=field)


#: files at least this large (bytes on disk) get a progress bar while they are read
PROGRESS_BYTES = 64 << 20


def _blocks(path: Path, chunk_bytes: int, progress: Optional[bool]) -> Iterator[Tuple[bytes, int]]:
    """The file's bytes (gunzipped when it starts with the gzip magic; without a UTF-8 byte
    order mark) in blocks of whole lines of about ``chunk_bytes`` each, with the bytes read
    from disk so far (compressed ones for gzip); every block but the last ends with a newline. A tqdm bar counts the bytes read from disk when
    ``progress`` (``None``: when the file is at least :data:`PROGRESS_BYTES`)."""
    if not path.is_file():
        raise DatasetNotFoundError(f"no such file: {path}")
    size = path.stat().st_size
    show = size >= PROGRESS_BYTES if progress is None else progress
    with open(path, "rb") as disk, tqdm(total=size, unit="B", unit_scale=True, disable=not show,
                                        desc=f"reading {path.name}", leave=False) as bar:
        gz = disk.read(2) == b"\x1f\x8b"
        disk.seek(0)
        f = gzip.GzipFile(fileobj=disk, mode="rb") if gz else disk
        carry, first, done = b"", True, 0
        while True:
            try:
                data = f.read(max(chunk_bytes, len(_BOM)) if first else chunk_bytes)
            except (OSError, EOFError, zlib.error) as exc:
                raise DataFormatError(path, f"corrupt or truncated gzip file ({exc})") from None
            bar.update(disk.tell() - done)
            done = disk.tell()
            if not data:
                if carry:
                    yield carry, done
                return
            if first:
                data = data[len(_BOM):] if data.startswith(_BOM) else data
                first = False
            buf = carry + data if carry else data
            k = buf.rfind(b"\n")
            if k < 0:
                carry = buf
                continue
            carry = buf[k + 1:]
            yield (buf if k + 1 == len(buf) else buf[:k + 1]), done


class _Rows:
    """A ``[R, C]`` array grown in place (``realloc``: no copy of what is there, so the
    peak stays at the final size plus one block)."""

    def __init__(self, C: int, capacity: int, dtype=np.float64):
        self.a = np.empty((max(capacity, 1), C), dtype=dtype)
        self.n = 0

    def reserve(self, rows: int) -> None:
        if rows > self.a.shape[0]:
            self.a.resize((rows, self.a.shape[1]), refcheck=False)

    def append(self, x: np.ndarray) -> None:
        need = self.n + x.shape[0]
        if need > self.a.shape[0]:
            self.reserve(max(need, self.a.shape[0] + self.a.shape[0] // 2))
        self.a[self.n:need] = x
        self.n = need

    def final(self) -> np.ndarray:
        if self.a.shape[0] != self.n:
            self.a.resize((self.n, self.a.shape[1]), refcheck=False)
        return self.a


def read_table(path: PathLike, *, names: Sequence[str], min_cols: int, max_cols: Optional[int] = None,
               comments: str = "#%", header: Union[bool, str] = "auto",
               chunk_bytes: Optional[int] = None, progress: Optional[bool] = None,
               features_from: Optional[int] = None) -> Table:
    """Read a numeric text table, fast, in bounded memory, with exact errors.

    The file is read and parsed in blocks of whole lines (``chunk_bytes``, default
    :data:`_CHUNK` = 4 MiB), appended into one growing array: the peak memory is the
    table itself plus a few blocks, never the whole text.

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
        chunk_bytes: bytes read and parsed at a time (the result does not depend on it).
        progress: show a tqdm bar over the bytes read (``None``: for files of at least
            :data:`PROGRESS_BYTES`).
        features_from: keep columns ``k..C-1`` as float32 ``features`` (converted block by
            block, so a wide feature table never exists in float64), with the first
            non-finite one in ``nonfinite`` for the caller to report.

    Returns:
        :class:`Table` with ``values [R, C]`` float64 and the line number of each row.

    Raises:
        DataFormatError: naming the line and field of a row with the wrong number of
            columns (the first missing field, or ``column N (unexpected)`` for the first
            extra one, 1-based) or of a field that is not a number.
    """
    path = Path(path)
    max_cols = min_cols if max_cols is None else max_cols
    chunk_bytes = int(_CHUNK if chunk_bytes is None else chunk_bytes)
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    comment_bytes = np.frombuffer(comments.encode(), dtype=np.uint8)
    size = path.stat().st_size if path.is_file() else 0

    def name(c: int) -> str:
        return names[c] if c < len(names) else f"feature_{c - len(names)}"

    def extra(c: int) -> str:
        """The field name of 0-based column ``c`` when no column ``c`` is expected."""
        return f"column {c + 1} (unexpected)"

    header_fields: Optional[List[str]] = None
    header_line: Optional[int] = None
    header_pending = True
    C: Optional[int] = None
    first_line = 0
    rows: Optional[_Rows] = None
    feats: Optional[_Rows] = None
    nonfinite: Optional[Tuple[int, int, float]] = None
    run_starts: List[np.ndarray] = []
    run_offsets: List[np.ndarray] = []
    last_offset: Optional[int] = None
    L = 0                 # lines of the file before the current block
    for raw, on_disk in _blocks(path, chunk_bytes, progress):
        if b"\r" in raw:
            raw = raw.replace(b"\r", b" ")
        rb = np.frombuffer(raw, dtype=np.uint8)
        nl = np.flatnonzero(rb == _NEWLINE)
        line_start = np.concatenate([np.zeros(1, dtype=np.int64), nl + 1])
        line_end = np.concatenate([nl, np.array([rb.size], dtype=np.int64)])  # exclusive
        if line_start[-1] >= rb.size:  # block ends with a newline: no last empty line
            line_start, line_end = line_start[:-1], line_end[:-1]
        n_lines = int(line_start.size)
        first = rb[np.minimum(line_start, max(rb.size - 1, 0))]
        comment = np.isin(first, comment_bytes) & (line_end > line_start)

        # header: the first line of the file that is neither a comment nor blank
        if header_pending:
            for i in np.flatnonzero(~comment).tolist():
                if not raw[line_start[i]:line_end[i]].strip():
                    continue
                header_pending = False
                text0 = raw[line_start[i]:line_end[i]].decode("utf-8", "replace")
                fields = [f.strip() for f in (text0.split(",") if "," in text0 else text0.split())]
                if header is True or (header == "auto" and looks_like_header(fields)):
                    header_fields, header_line = fields, L + i + 1
                    comment[i] = True
                break

        if n_lines:
            seg = raw[:int(line_end[-1])]
            _refuse_empty_fields(path, seg, line_start, comment, L, name)
            seg = seg.replace(b",", b" ").replace(b"\t", b" ")
            ncols = _count_fields(seg, nl[:n_lines - 1], n_lines)
            data = np.flatnonzero(~comment & (ncols > 0))
        else:
            data = np.zeros(0, dtype=np.int64)
        if data.size:
            if C is None:
                C, first_line = int(ncols[data[0]]), L + int(data[0]) + 1
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
                                      line=L + r + 1, field=name(got) if got < C else extra(C))
            drop = np.flatnonzero(comment)
            if drop.size == 0:
                body = seg
            else:  # the bytes of the kept lines: slices between dropped (comment/header) lines
                cut_s = np.concatenate([[0], line_end[drop]]).tolist()
                cut_e = np.concatenate([line_start[drop], [len(seg)]]).tolist()
                body = b" ".join(seg[a:e] for a, e in zip(cut_s, cut_e) if e > a)
            flat = _parse_numbers(body)
            del body, seg
            if flat is None or flat.size != data.size * C:
                _scan_for_bad_field(path, raw, line_start[data], line_end[data], name, L)
                raise DataFormatError(path, "could not parse the numbers (no single bad field found)")
            block = flat.reshape(-1, C)
            if rows is None:   # the whole file's rows, estimated from this first block
                # (untouched rows cost no memory; a low guess grows by half, in place)
                est = int(block.shape[0] * max(size, 1) / max(on_disk, 1) * 1.05) + 1024
                est = est if size > on_disk else block.shape[0]
                k = C if features_from is None else min(C, features_from)
                rows = _Rows(k, est)
                feats = _Rows(C - k, est, np.float32) if C > k else None
            if feats is not None:
                fb = block[:, k:]
                if nonfinite is None and not np.isfinite(fb).all():
                    ok = np.isfinite(fb)
                    r = int(np.flatnonzero(~ok.all(axis=1))[0])
                    c = int(np.flatnonzero(~ok[r])[0])
                    nonfinite = (rows.n + r, c, float(fb[r, c]))
                feats.append(fb.astype(np.float32))
                block = block[:, :k]
            # line numbers as runs: a new run wherever (line - row) changes
            offs = L + data.astype(np.int64) + 1 - (rows.n + np.arange(data.size, dtype=np.int64))
            cut = np.flatnonzero(np.diff(offs)) + 1
            if last_offset is None or offs[0] != last_offset:
                cut = np.concatenate([[0], cut])
            run_starts.append(rows.n + cut)
            run_offsets.append(offs[cut])
            last_offset = int(offs[-1])
            rows.append(block)
            del flat, block
        L += n_lines
    if C is None or rows is None:
        raise DataFormatError(path, "the file holds no data rows")
    vals = rows.final()
    lines = LineNumbers(np.concatenate(run_starts).astype(np.int64),
                        np.concatenate(run_offsets).astype(np.int64), vals.shape[0])
    return Table(vals, lines, header_fields, path, header_line,
                 None if feats is None else feats.final(), nonfinite)


def looks_like_header(fields: Sequence[str]) -> bool:
    """A line is a header when none of its (non-empty) fields is a number: a data line
    with one mistyped field (``1,2,5,1O0``) is data, and its bad field gets reported."""
    return not any(_is_number(f) for f in fields if f)


_CHUNK = 4 << 20     # bytes of text parsed at a time: its temporaries are ~8x this


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


def _scan_for_bad_field(path: Path, raw: bytes, starts: np.ndarray, ends: np.ndarray, name,
                        line_offset: int = 0) -> None:
    """Slow path: find the first field that is not a number and raise for it.

    Splits the bytes as the fast path does (comma, tab and space only) and accepts exactly
    what numpy's reader accepts (:func:`_is_number`), so the field that made it fail is found.
    ``raw`` is a block of the file that starts after ``line_offset`` lines.
    """
    for s, e in zip(starts.tolist(), ends.tolist()):
        toks = raw[s:e].replace(b",", b" ").replace(b"\t", b" ").split(b" ")
        fields = [t.decode("utf-8", "replace") for t in toks if t]
        for c, tok in enumerate(fields):
            if not _is_number(tok):
                lineno = line_offset + raw.count(b"\n", 0, s) + 1
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
        times, shape ``[R]``, float64 (a contiguous copy: the table can be freed).
    """
    x = table.values[:, col]
    check_times(x, table.path, lines=table.lines, field=field)
    return np.ascontiguousarray(x)


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
    the number of ids, else ``np.unique`` and a binary search; both give the same result.
    Neither concatenates ``src`` and ``dst`` on the dense path, so the temporary memory is
    the two outputs (16 bytes an event) plus the table.

    Returns:
        ``(src, dst, node_map)``: new ids ``[E]`` each, int64, and ``node_map [N]``
        holding the original id of each new id (sorted ascending).
    """
    E = src.shape[0]
    top = int(max(src.max(), dst.max())) if E else -1
    if top < 8 * E + (1 << 20):
        present = np.zeros(top + 1, dtype=bool)
        present[src] = True
        present[dst] = True
        uniq = np.flatnonzero(present)
        new_id = np.cumsum(present, dtype=np.int64) - 1
        del present
        s, d = new_id[src], new_id[dst]
    else:
        uniq = np.unique(np.concatenate([src, dst]))
        s, d = np.searchsorted(uniq, src), np.searchsorted(uniq, dst)
    return (torch.from_numpy(s.astype(np.int64, copy=False)), torch.from_numpy(d.astype(np.int64, copy=False)),
            torch.from_numpy(uniq.astype(np.int64)))


def sort_by_time(src: Tensor, dst: Tensor, t: np.ndarray, **kwargs) -> "TemporalGraph":
    """The :class:`TemporalGraph` of these events sorted stably by time: the graph
    ``TemporalGraph.sorted(src, dst, t, **kwargs)`` gives, bit for bit, in less memory.

    The events are permuted **in place** (``src``, ``dst``, ``t`` and the ``edge_attr`` /
    ``labels`` of ``kwargs``: pass arrays nobody else holds, as the loaders do), one
    column at a time, so the peak is the events plus the permutation (8 bytes an event)
    and one column, not three copies; nothing moves when ``t`` is already in order.

    Args:
        src, dst: node ids ``[E]`` int64 tensors; t: times ``[E]`` float64 (array or
            tensor); kwargs: the other :class:`TemporalGraph` fields.
    """
    from tgl_dist.data.temporal import TemporalGraph
    t = torch.as_tensor(t, dtype=torch.float64).contiguous()
    src = torch.as_tensor(src, dtype=torch.long).contiguous()
    dst = torch.as_tensor(dst, dtype=torch.long).contiguous()
    for key in ("edge_attr", "labels"):
        if kwargs.get(key) is not None:
            kwargs[key] = torch.as_tensor(kwargs[key]).contiguous()
    tn = t.numpy()
    in_order = tn.size < 2 or bool((tn[1:] >= tn[:-1]).all())    # False when a time is NaN
    if not in_order and np.isfinite(tn).all() and src.numel() == dst.numel() == tn.size:
        order = np.argsort(tn, kind="stable")      # the permutation torch.sort(stable=True) gives
        for x in (src, dst, t, kwargs.get("edge_attr"), kwargs.get("labels")):
            if x is not None and x.dim() >= 1 and x.size(0) == order.size:
                a = x.numpy()
                a[...] = a[order]
        in_order = True
    if in_order:
        return TemporalGraph(src, dst, t, **kwargs)
    return TemporalGraph.sorted(src, dst, t, **kwargs)    # raises for the malformed events


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

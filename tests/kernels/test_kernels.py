"""tgl_dist.kernels: one subsystem for the compiled code (sources, signatures, ABI stamp, layering)."""
import ctypes
import re
import shutil
from pathlib import Path

import pytest

from tgl_dist import kernels
from tgl_dist.kernels import LIBRARIES, build as kb, signatures

PKG = Path(kernels.__file__).resolve().parents[1]   # tgl_dist/


def _modules():
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if not rel.startswith("kernels/"):
            yield rel, p.read_text()


def test_only_kernels_imports_ctypes_or_knows_compilers():
    """No module outside tgl_dist/kernels/ opens a kernel through ctypes, builds one or
    reaches into the build machinery. A few call a system library through ctypes (glibc's
    mallopt, renameat2 and madvise in the process's own symbols, ``CDLL(None)``; METIS):
    those are allowed, and only those."""
    for rel, text in _modules():
        if re.search(r"^\s*(import ctypes|from ctypes)", text, re.M):
            opened = re.findall(r"CDLL\(([^,)]*)", text)
            assert opened, f"{rel} imports ctypes but opens no system library"
            for arg in opened:
                assert arg == "None" or "METIS" in text, f"{rel} opens CDLL({arg}) outside kernels/"
        for needle in ("kernels.build", "kernels.signatures", "require_compiler", "build_cached",
                       "open_library", "-fopenmp", "argtypes = [_P"):
            assert needle not in text, f"{rel} mentions {needle}"


def test_every_c_source_and_header_lives_in_kernels_and_ships():
    """C code lives in tgl_dist/kernels/ only, the one folder pyproject's package-data ships."""
    outside = [p for p in PKG.rglob("*") if p.suffix in (".c", ".h") and p.parent.name != "kernels"]
    assert not outside, outside
    text = (PKG.parent / "pyproject.toml").read_text()
    assert '"tgl_dist.kernels" = ["*.c", "*.h"]' in text
    srcs = {p.name for p in (PKG / "kernels").glob("*.c")}
    assert srcs == {L.source.name for L in LIBRARIES}


def test_every_library_declares_its_signatures_once_in_c():
    """Each library's exported functions parse (return and argument types known), each
    source includes the ABI stamp, and no hand-kept version number is left."""
    for L in LIBRARIES:
        sigs = L.signatures()
        assert sigs, L.what
        text = L.source.read_text()
        assert '#include "abi.h"' in text
        assert not re.search(r"_ABI\b|return \d+; *}\s*$", text, re.M)
        for s in sigs.values():
            res, args = s.ctypes()
            assert len(args) == len(s.args)
    att = kernels.ATTENTION.signatures()["tgl_att_layer_bwd"]
    assert len(att.args) == 64 and att.args[0] == ("D", "int64_t") and att.restype == "int"


def test_parser_reads_pointers_scalars_and_rejects_unknown_types(tmp_path):
    src = tmp_path / "k.c"
    src.write_text("static int tgl_hidden(int a) { return a; }\n"
                   "void tgl_a(int64_t n, const float *x, float *const *p, double s,\n"
                   "           uint64_t seed, int flag) { }\n"
                   "int64_t tgl_b(void) { return 0; }\n")
    sigs = signatures.parse(src)
    assert list(sigs) == ["tgl_a", "tgl_b"]
    assert sigs["tgl_a"].args == (("n", "int64_t"), ("x", "ptr"), ("p", "ptr"), ("s", "double"),
                                  ("seed", "uint64_t"), ("flag", "int"))
    assert sigs["tgl_a"].ctypes() == (None, [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_double, ctypes.c_uint64, ctypes.c_int])
    assert sigs["tgl_b"].ctypes() == (ctypes.c_int64, [])
    src.write_text("void tgl_c(long n) { }\n")
    with pytest.raises(ValueError, match="long"):
        signatures.parse(src)


def test_abi_stamp_is_the_source_hash_and_a_stale_build_is_refused(tmp_path):
    """A library built from other sources (here: an edited copy) carries another stamp,
    and opening it against today's source fails with a clear error."""
    cc = kb.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    L = kernels.WRITEBACK
    path, _ = L.build(cc, tmp_path / "cache")
    lib = L.open(path)
    assert lib.tgl_abi_hash() == kb.source_hash(L.source)
    assert lib.tgl_wb_update_last.argtypes[0] is ctypes.c_int64   # generated from the C
    copy = tmp_path / "writeback.c"
    copy.write_text(L.source.read_text() + "\n/* edited */\n")
    shutil.copy(L.source.parent / "abi.h", tmp_path / "abi.h")
    assert kb.source_hash(copy) != kb.source_hash(L.source)
    stale = kb.build(cc, tmp_path / "cache", copy, L.flags)
    with pytest.raises(RuntimeError, match="ABI"):
        L.open(stale)
    # the stamp covers the included headers too
    (tmp_path / "abi.h").write_text((tmp_path / "abi.h").read_text() + "\n")
    assert kb.source_hash(copy) != kb.source_hash(L.source)


def test_a_source_without_the_stamp_does_not_build(tmp_path):
    cc = kb.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    shutil.copy(kernels.SAMPLER.source.parent / "abi.h", tmp_path / "abi.h")
    src = tmp_path / "x.c"
    src.write_text('#include "abi.h"\nint tgl_x(void) { return 1; }\n')
    assert kb.build(cc, tmp_path, src)      # the build passes -DTGL_ABI_HASH
    import subprocess
    res = subprocess.run([*cc, "-shared", "-fPIC", str(src), "-o", str(tmp_path / "x.so")],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "TGL_ABI_HASH" in res.stderr


def test_no_kernel_variable_turns_every_library_off(monkeypatch):
    monkeypatch.setenv("TGL_DIST_NO_KERNEL", "1")
    assert kernels.disabled()
    for L in LIBRARIES:
        assert L.get() is None
        with pytest.raises(RuntimeError, match="TGL_DIST_NO_KERNEL"):
            L.load()
    monkeypatch.setenv("TGL_DIST_NO_KERNEL", "0")
    assert not kernels.disabled()

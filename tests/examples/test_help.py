"""``--help`` of the example scripts: every default said once, none for unset options."""
import argparse
import os
import sys
import re
from pathlib import Path

import pytest

from scripts_util import load_script
from tgl_dist.checkpoint import CheckpointError
from tgl_dist.errors import DataFormatError
from tgl_dist.cli import (HelpFormatter, add_run_arguments, file_path, folder_path,
                          non_negative_float, non_negative_int, parse_run_arguments,
                          positive_float, positive_int, run_script)

REPO = Path(__file__).resolve().parents[2]


def _help(parser: argparse.ArgumentParser) -> str:
    return re.sub(r"\s+", " ", parser.format_help())


def test_formatter_adds_a_default_once():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--lr", type=float, default=None, help="override the config's lr")
    p.add_argument("--fmt", default=None, help="file format (default: inferred)")
    p.add_argument("--out", default="parts", help="output root (default: ./parts)")
    p.add_argument("--quiet", action="store_true", help="no bars")
    text = _help(p)
    assert "seed (default: 0)" in text              # 0 is a real default, not "unset"
    assert "override the config's lr --fmt" in text  # None: nothing added
    assert "(default: inferred) --out" in text       # the help's own wording kept, once
    assert text.count("default: ./parts") == 1 and "(default: parts)" not in text
    assert "no bars" in text and "default: False" not in text


@pytest.mark.parametrize("script", ["ctdg/train_tgn.py", "ctdg/custom_model.py",
                                    "dtdg/_common.py"])
def test_example_help_has_no_repeated_or_empty_default(script):
    path = REPO / "examples" / script
    mod = load_script(path, "_help_" + path.stem)
    parser = (mod.build_parser() if script.startswith("ctdg") else
              mod.build_parser("Train.", "d", "evolvegcn-o", 10, 0.01, 30, 4))
    assert parser.formatter_class is HelpFormatter
    fmt = HelpFormatter(parser.prog)
    for action in parser._actions:
        if action.help and action.help != argparse.SUPPRESS:
            text = fmt._get_help_string(action) % {"default": action.default}
            assert text.lower().count("default") <= 1, (action.option_strings, text)
            assert "(default: None)" not in text and "(default: False)" not in text


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train.py")
    add_run_arguments(p)
    return p


@pytest.mark.parametrize("argv, expected", [
    ([], (1, "epochs")), (["--checkpoint-every", "500"], (500, "steps")),
    (["--checkpoint-every", "3e", "--checkpoint-dir", "ck", "--resume"], (3, "epochs")),
])
def test_parse_run_arguments_gives_the_checkpoint_schedule(argv, expected):
    args, every = parse_run_arguments(_run_parser(), argv)
    assert (every.n, every.unit) == expected
    assert args.checkpoint_every == (argv[1] if argv else "1e")


@pytest.mark.parametrize("argv, message", [
    (["--checkpoint-every", "x"], "--checkpoint-every: expected N (steps), Ns or Ne"),
    (["--checkpoint-every", "0"], "with N >= 1"),
    (["--resume"], "--resume needs --checkpoint-dir"),
])
def test_parse_run_arguments_rejects_bad_checkpoint_options(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_run_arguments(_run_parser(), argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_run_script_ends_a_checkpoint_error_without_a_stack_trace():
    def main(x):
        if x:
            raise CheckpointError("the run in ck/ was written by 2 ranks, this one has 1")
        return "done"

    assert run_script(main, 0) == "done"
    with pytest.raises(SystemExit) as e:
        run_script(main, 1)
    assert str(e.value.code) == "error: the run in ck/ was written by 2 ranks, this one has 1"
    with pytest.raises(SystemExit) as e:     # the package's input errors: one line, no trace
        run_script(lambda: (_ for _ in ()).throw(DataFormatError("d.csv", "bad time", line=3)))
    assert str(e.value.code).startswith("error: d.csv") and "line 3" in str(e.value.code)
    with pytest.raises(KeyError):   # anything else is not caught
        run_script(lambda: {}["x"])


@pytest.mark.parametrize("check, text, ok", [
    (positive_int, "3", 3), (positive_int, "0", None), (positive_int, "-1", None),
    (positive_int, "x", None), (non_negative_int, "0", 0), (non_negative_int, "-3", None),
    (positive_float, "1e-3", 1e-3), (positive_float, "nan", None), (positive_float, "inf", None),
    (positive_float, "0", None), (non_negative_float, "0", 0.0), (non_negative_float, "-1", None),
    (non_negative_float, "-inf", None),
])
def test_number_validators(check, text, ok):
    if ok is None:
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected .*, got '{text}'"):
            check(text)
    else:
        assert check(text) == ok


def test_path_validators(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    assert folder_path(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    with pytest.raises(argparse.ArgumentTypeError, match="afile is not a folder$"):
        folder_path(str(f))
    with pytest.raises(argparse.ArgumentTypeError, match=r"afile is not a folder \(in .*afile/x\)"):
        folder_path(str(f / "x"))
    assert file_path(str(tmp_path / "m.csv")) == str(tmp_path / "m.csv")
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder, expected a file name"):
        file_path(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="afile is not a folder"):
        file_path(str(f / "m.csv"))


@pytest.mark.parametrize("argv, message", [
    (["--eval-neg", "-3"], "argument --eval-neg: expected a positive integer, got '-3'"),
    (["--eval-neg", "0"], "argument --eval-neg: expected a positive integer"),
    (["--threads", "0"], "argument --threads: expected a positive integer, got '0'"),
    (["--threads", "-1"], "argument --threads: expected a positive integer, got '-1'"),
    (["--queue-size", "-1"], "argument --queue-size: expected a non-negative integer"),
    (["--timeout", "nan"], "argument --timeout: expected a positive finite number, got 'nan'"),
    (["--parts", "{file}"], "argument --parts: {file} is not a folder"),
    (["--checkpoint-dir", "{file}"], "argument --checkpoint-dir: {file} is not a folder"),
    (["--metrics-csv", "{dir}"], "argument --metrics-csv: {dir} is a folder, expected a file name"),
    # the training overrides and seeds: usage errors too (numpy's seeding used to raise a
    # trace for --seed -1; --epochs 0 / --lr nan used to exit 1)
    (["--lr", "nan"], "argument --lr: expected a positive finite number, got 'nan'"),
    (["--lr", "inf"], "argument --lr: expected a positive finite number, got 'inf'"),
    (["--lr", "-0.1"], "argument --lr: expected a positive finite number, got '-0.1'"),
    (["--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
    (["--batch-size", "0"], "argument --batch-size: expected a positive integer, got '0'"),
    (["--patience", "0"], "argument --patience: expected a positive integer, got '0'"),
    (["--seed", "-1"], "argument --seed: expected a seed in [0, 2^32), got '-1'"),
    (["--seed", "4294967296"], "argument --seed: expected a seed in [0, 2^32), got '4294967296'"),
    (["--data-seed", "-1"], "argument --data-seed: expected a seed in [0, 2^32), got '-1'"),
    (["--num-events", "0"], "argument --num-events: expected a positive integer, got '0'"),
])
def test_train_tgn_rejects_bad_arguments(argv, message, tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    fill = {"file": str(f), "dir": str(tmp_path)}
    mod = load_script(REPO / "examples" / "ctdg" / "train_tgn.py", "_args_train_tgn")
    with pytest.raises(SystemExit) as e:
        parse_run_arguments(mod.build_parser(), [a.format(**fill) for a in argv])
    assert e.value.code == 2
    assert message.format(**fill) in capsys.readouterr().err


def test_train_tgn_help_lists_the_models_the_epochs_default_and_no_figures():
    mod = load_script(REPO / "examples" / "ctdg" / "train_tgn.py", "_help_models_train_tgn")
    text = _help(mod.build_parser())
    models = sorted(f.stem for f in (REPO / "configs").glob("*.yml"))
    assert "TGN" in models and "JODIE" in models
    assert f"shipped models: configs/<NAME>.yml, NAME one of {', '.join(models)}" in text
    assert ("epochs (default: the config's train.epoch, 30 in configs/TGN_DyGLib-embedding.yml; "
            "early stopping after train.patience, 5, epochs without a better val AP)") in text
    assert "override train.patience: 5 in configs/TGN_DyGLib-embedding.yml" in text
    assert "TGN with DyGLib's settings and a node embedding" in text
    queue = text.split("--queue-size", 2)[-1].split("--metrics-csv")[0]
    assert "benchmarks/RESULTS.md" in queue and not re.search(r"\d,\d{3}|events/s", queue)
    assert "--out" in text and "runs/<data>_<model>_<timestamp>" in text


def test_threads_default_is_the_machines_cores_over_its_own_ranks(monkeypatch):
    """``--threads`` defaults from the ranks on this machine (torchrun's LOCAL_WORLD_SIZE),
    not from the world size: two machines of 2 ranks each give each rank half its
    machine's cores, not a quarter."""
    import os

    import pytest

    from tgl_dist.cli import default_threads
    cores = os.cpu_count() or 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert default_threads(1) == cores
    assert default_threads(4) == max(1, cores // 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads(4) == max(1, cores // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        default_threads(4)


@pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                    reason="TGL_DIST_NO_KERNEL=1: an error before any model runs, tested in the first run")
def test_torchrun_prints_a_users_error_once_and_names_it_as_the_root_cause(tmp_path):
    """Under torchrun with 2 ranks, a bad input file gives ONE ``error: ...`` line (rank
    0's; rank 1 has the same message and stays quiet) and torchrun's failure summary shows
    that message as each rank's cause (the error file), not "To enable traceback see"."""
    import subprocess

    from tgl_dist.testing import free_port
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={free_port()}", str(REPO / "examples/ctdg/train_tgn.py"),
                        "--data", str(bad), "--parts", str(tmp_path / "parts"),
                        "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    ours = [ln for ln in r.stderr.splitlines() if "error: DataFormatError" in ln]
    printed = [ln for ln in ours if ln.startswith(("error:", "[rank"))]
    assert len(printed) == 1 and printed[0].startswith("error: DataFormatError"), r.stderr
    assert "bad.csv, line 1" in printed[0]
    causes = [ln for ln in ours if ln.strip().startswith("traceback :")]
    assert len(causes) == 2, r.stderr   # torchrun's summary: rank 0 (root cause) and rank 1
    assert "To enable traceback" not in r.stderr


def test_fail_on_another_rank_without_a_group_leaves_the_message_to_the_error_file(
        tmp_path, monkeypatch):
    """Before the process group exists, only rank 0 prints (every rank parsed the same
    command line); rank 1's message still reaches torchrun's summary through its error file."""
    import json

    import pytest

    from tgl_dist.cli import fail
    err = tmp_path / "error.json"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
    with pytest.raises(SystemExit) as e:
        fail("error: something on rank 1")
    assert e.value.code == 1    # quiet: exit status 1, nothing printed
    assert json.loads(err.read_text())["message"] == "error: something on rank 1"
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as e:
        fail("error: on rank 0")
    assert e.value.code == "error: on rank 0"   # printed by the interpreter, exit status 1

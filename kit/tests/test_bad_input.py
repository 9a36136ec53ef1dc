"""Bad input, row by row from ``bad_inputs.CASES``, on the tiny project: each is refused (or, for a
warning, said) with the field or file and the fix, exits with its code without a traceback, runs no
code from a checkpoint, and leaves an earlier run's files as they were and no new run directory
behind. kit/docs/errors.md quotes every row's message."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bad_inputs import CASES, VALUES
from conftest import KIT, main
from projkit.testing import config, launch
from projkit.testing.bad_input import (
    QUICK,
    Case,
    as_params,
    assert_said,
    digests,
    make_baseline,
    run_case,
    run_dirs,
)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier run, made once for the file: a tiny classify fit with its checkpoint."""
    return make_baseline(tmp_path_factory.mktemp("baseline"), config("classify.yaml"))


@pytest.mark.parametrize("case", as_params(CASES))
def test_bad_input(case: Case, baseline, workdir, monkeypatch, capsys):
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_said(case, run_case(case, baseline, workdir, monkeypatch, capsys, VALUES))


def refused_on_a_full_disk(baseline: Path, workdir: Path, monkeypatch, capsys, net: str, room: int) -> None:
    """A fit with the flag ``net`` on runs/ mounted as a tmpfs of ``room`` KiB holding the earlier
    run: refused in one line naming the checkpoint it could not write, the earlier run as it was and
    no new run directory left."""
    if os.geteuid() != 0:
        pytest.skip(
            "mounts a small tmpfs on runs/, which needs root (CI runs as root): "
            "sudo .venv/bin/python -m pytest kit/tests/test_bad_input.py -k full_disk"
        )
    runs = workdir / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}k", "tmpfs", str(runs)], check=True)
    try:
        shutil.copytree(baseline, runs, dirs_exist_ok=True)
        before = digests(runs)
        monkeypatch.delenv("PROJ_DEBUG")
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", config("classify.yaml"), *QUICK, net])
        message, *rest = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert exit_info.value.code == 2
        assert message.startswith("error: cannot write 'runs/classify/version_1/checkpoints/"), message
        assert "no space left" in message.lower() and rest == ["(PROJ_DEBUG=1 shows where it was raised.)"]
        assert run_dirs(runs) == {"classify/version_0"}
        assert digests(runs) == before
    finally:
        # Lazily: a memory-mapped read still held by the error's traceback keeps the folder busy.
        subprocess.run(["umount", "--lazy", str(runs)], check=True)


HIDDEN = "--model.init_args.net.init_args.hidden"  # the MLP's width: the size of its checkpoints


def used_kib(path: Path) -> int:
    """What a file, or a folder's files, take on a tmpfs, in KiB: whole pages of 4 KiB each."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return sum(4 * -(-p.stat().st_size // 4096) for p in files)


@pytest.mark.slow
def test_full_disk_is_said_as_such(baseline, workdir, monkeypatch, capsys):
    """runs/ on a file system with room for the earlier run and a new run's small files but not its
    checkpoint (of a network wide enough that its weights pass the file's buffer): a tmpfs of that
    size, where torch's zip writer says only ``unexpected pos``."""
    refused_on_a_full_disk(baseline, workdir, monkeypatch, capsys, f"{HIDDEN}=4096", used_kib(baseline) + 256)


@pytest.mark.slow
def test_full_disk_at_a_small_checkpoint_is_said_as_such(baseline, workdir, monkeypatch, capsys):
    """The same, with room for a new run's small files and one page short of its checkpoint, which
    the tiny network's (36 KiB) is written whole into the file's buffer first."""
    checkpoint = used_kib(baseline / "classify" / "version_0" / "checkpoints" / "last.ckpt")
    room = used_kib(baseline) + checkpoint - 4
    refused_on_a_full_disk(baseline, workdir, monkeypatch, capsys, f"{HIDDEN}=32", room)


def test_gradient_clip_val_0_turns_clipping_off(workdir):
    """0 is Lightning's "no clipping", as null is: taken, not refused as a negative norm."""
    args = [*QUICK, "--test_after_fit=false", "--trainer.gradient_clip_val=0"]
    cli = main(["fit", "--config", config("classify.yaml"), *args])
    assert cli.trainer.gradient_clip_val == 0 and cli.trainer.global_step == 2


FAQ = (KIT / "docs" / "errors.md").read_text()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_readme_faq_quotes_the_message(case: Case):
    assert case.words[0] in FAQ, f"kit/docs/errors.md lacks `{case.words[0]}`"


def python_m(args: list[str], workdir: Path) -> subprocess.CompletedProcess:
    return launch.run(args, workdir, {**os.environ, "PROJ_DEBUG": ""})


@pytest.mark.slow
def test_no_traceback_at_the_top_level_unless_asked(workdir):
    """As a user runs it: one line of error and exit code 2; with PROJ_DEBUG=1 (as this file's other
    tests run) the error itself is raised, so Python prints its traceback."""
    args = ["fit", "--config", config("classify.yaml"), "--model.init_args.net.init_args.hidden=0"]
    plain = python_m(args, workdir)
    assert plain.returncode == 2, plain.stderr[-2000:]
    assert "Traceback" not in plain.stderr and "net.hidden must be a positive width" in plain.stderr
    assert "PROJ_DEBUG=1 shows" in plain.stderr
    with pytest.raises(ValueError, match=r"net\.hidden must be a positive width"):
        main(args)
    assert not (workdir / "runs").exists() or not any((workdir / "runs").glob("*/*"))

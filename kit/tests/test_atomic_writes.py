"""What the commands write beside a run's checkpoints is replaced in one step, and a full disk is
one line: an export on a full disk, an export killed while it swaps folders, a resume config
emptied by a kill, a resume of a run whose config.yaml is gone, `test` and `predict` leaving the
run's hparams.yaml as `fit` wrote it, and the loggers' whole files killed mid-write. One finished
run (with an export) is copied for each."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import main
from projkit.testing import TINY_FIT, config, launch

RUN = Path("runs/classify/version_0")
EXPORT = RUN / "export" / "last"
CLASSIFY = ("--config", config("classify.yaml"), *TINY_FIT)
ONE_MORE_EPOCH = ("--trainer.max_epochs=2", "--test_after_fit=false", "--ckpt_path=last")
EXPORT_LAST = ["export", *CLASSIFY, "--ckpt_path=last"]
KILL_IN_HPARAMS_WRITE = "trainer:\n  callbacks+:\n    - class_path: faults.KillInHparamsWrite\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-epoch classify run (two steps) and its export of last.ckpt."""
    folder = tmp_path_factory.mktemp("base")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main(["fit", *CLASSIFY, "--test_after_fit=false"])
        main(EXPORT_LAST)
    return folder


@pytest.fixture
def work(base: Path, workdir: Path) -> Path:
    shutil.copytree(base / "runs", workdir / "runs", symlinks=True)
    return workdir


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def resumed(*args: str) -> list[str]:
    """A resume that trains a second epoch with ``args``: what it warned of settings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", *CLASSIFY, *ONE_MORE_EPOCH, *args])
    return [str(w.message) for w in caught if "other settings" in str(w.message)]


@pytest.mark.slow
def test_an_export_on_a_full_disk_is_one_line_and_keeps_the_earlier_one(work: Path):
    """runs/ on a tmpfs with a page of room: torch's archive writer aborted the process (exit 134,
    a C++ stack dump) and left a temporary folder."""
    if os.geteuid() != 0:
        pytest.skip("mounts a small tmpfs on runs/, which needs root (CI runs as root)")
    shutil.move(work / "runs", work / "copy")
    used = sum(4 * -(-p.stat().st_size // 4096) for p in (work / "copy").rglob("*") if p.is_file())
    (work / "runs").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={used + 8}k", "tmpfs", "runs"], check=True)
    try:
        shutil.copytree(work / "copy", work / "runs", dirs_exist_ok=True, symlinks=True)
        before = digests(work / "runs")
        result = launch.run(EXPORT_LAST, work, {**os.environ, "PROJ_DEBUG": ""}, timeout=300)
        lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert result.returncode == 2, result.stderr[-3000:]
        assert len(lines) == 1 and f"cannot write '{EXPORT}'" in lines[0], lines
        assert "No space left on device" in lines[0]
        assert digests(work / "runs") == before, "the earlier export as it was, nothing left beside"
        assert sorted(p.name for p in (work / RUN / "export").iterdir()) == ["last"]
    finally:
        subprocess.run(["umount", "--lazy", "runs"], check=True)


@pytest.mark.slow
def test_an_export_killed_between_its_renames_is_put_back(work: Path):
    """Where the system cannot swap two folders in one step, an export takes two renames: killed
    between them, the earlier export waits aside as .last.<pid>.old, and the next export of the
    checkpoint puts it back before replacing it, leaving nothing hidden."""
    dead = 2**22 + 1  # above any process id the system hands out
    aside = work / RUN / "export" / f".last.{dead}.old"
    os.replace(work / EXPORT, aside)
    shutil.copytree(aside, work / RUN / "export" / f".last.{dead}.tmp")
    main(EXPORT_LAST)
    assert sorted(p.name for p in (work / RUN / "export").iterdir()) == ["last"]
    assert sorted(p.name for p in (work / EXPORT).iterdir()) == ["model.json", "model.onnx", "model.pt2"]


@pytest.mark.slow
def test_a_resume_config_emptied_by_a_kill_is_said_in_one_setting(work: Path):
    """A kill while kit 1.0 wrote config.from_step_<N>.yaml left it empty: the next resume compared
    its settings with nothing and printed the whole config as one "setting"."""
    (work / RUN / "config.from_step_1.yaml").write_text("")
    said = resumed("--data.batch_size=8")
    assert len(said) == 1 and "config.from_step_1.yaml holds no settings (empty). The run trains" in said[0]
    assert "class_path" not in said[0], "no config dumped as a setting"
    assert (work / RUN / "config.from_step_2.yaml").read_text().count("batch_size: 8") == 1


@pytest.mark.slow
def test_a_resume_of_a_run_without_its_config_claims_no_earlier_step(work: Path):
    """config.yaml deleted: the resume wrote a new one with its own settings, claiming them for
    every step the run trained; now it saves them from its step on, and says what is unknown."""
    (work / RUN / "config.yaml").unlink()
    said = resumed("--data.batch_size=8")
    assert not (work / RUN / "config.yaml").exists()
    assert len(said) == 1 and "config.yaml is missing, so the settings before step 2 are unknown" in said[0]
    assert said[0].endswith(f"(saved in {RUN}/config.from_step_2.yaml).")
    assert "batch_size: 8" in (work / RUN / "config.from_step_2.yaml").read_text()


@pytest.mark.slow
def test_test_and_predict_leave_the_runs_hparams_yaml_as_fit_wrote_it(work: Path):
    before = (work / RUN / "hparams.yaml").read_text()
    for command in ("test", "predict"):
        main([command, *CLASSIFY, "--ckpt_path=last", "--data.batch_size=7"])
    assert (work / RUN / "hparams.yaml").read_text() == before


@pytest.mark.slow
def test_a_kill_while_a_resume_writes_hparams_yaml_leaves_it_whole(work: Path):
    """Lightning's save_hparams_to_yaml empties the file, then writes it: a kill in between left a
    resumed run's hparams.yaml empty."""
    before = (work / RUN / "hparams.yaml").read_text()
    (work / "kill.yaml").write_text(KILL_IN_HPARAMS_WRITE)
    killed = launch.run(["fit", *CLASSIFY, *ONE_MORE_EPOCH, "--config", "kill.yaml"], work, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (work / RUN / "hparams.yaml").read_text() == before


# The kit's CSV writer, killed as it writes the rows again under a new column's header.
KILLED_IN_A_REWRITE = """
import csv, os, shutil, signal, sys
from projkit.rundir.log_files import AtomicExperimentWriter
writer = AtomicExperimentWriter(log_dir=sys.argv[1])
writer.log_metrics({"train/loss": 1.0}, step=0)
writer.save()
shutil.copy(writer.metrics_file_path, sys.argv[2])
csv.DictWriter.writerows = lambda self, rows: os.kill(os.getpid(), signal.SIGKILL)
writer.log_metrics({"val/loss": 2.0}, step=1)
writer.save()
"""


@pytest.mark.slow
def test_a_kill_while_a_new_column_rewrites_metrics_csv_keeps_every_row(tmp_path: Path):
    """Lightning's CSV writer rewrites metrics.csv in place when a metric's column first appears: a
    kill in that rewrite left the file cut to its header."""
    logs, before = tmp_path / "logs", tmp_path / "before.csv"
    args = [sys.executable, "-c", KILLED_IN_A_REWRITE, str(logs), str(before)]
    killed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (logs / "metrics.csv").read_text() == before.read_text()
    assert before.read_text().splitlines()[1:] == ["0,1.0"]


@pytest.mark.slow
def test_a_kill_while_tensorboard_writes_hparams_yaml_leaves_none_cut(workdir: Path):
    """TensorBoard's logger writes hparams.yaml only when it is missing: a kill in that write left it
    empty for good. Now it is there whole or not at all; a run not killed has it whole."""
    (workdir / "kill.yaml").write_text(KILL_IN_HPARAMS_WRITE)
    tensorboard = "--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger"
    killed = launch.run(["fit", *CLASSIFY, tensorboard, "--config", "kill.yaml"], workdir, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (workdir / RUN / "hparams.yaml").exists()
    main(["fit", *CLASSIFY, tensorboard, "--test_after_fit=false"])
    assert "net:" in (workdir / RUN.parent / "version_1" / "hparams.yaml").read_text()

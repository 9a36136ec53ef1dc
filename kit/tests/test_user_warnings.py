"""What a user reads: each command of a digits-like experiment (tinyproj's classify.yaml), `fit`, then
`test`, `predict` and `export` on fit's checkpoint and `serve` on the export, prints no warning but
those about the user's own run (``USERS_OWN``, each with why it helps the user). Every command runs
as a user starts it, in a new interpreter, with ``PYTHONWARNINGS=default`` and all of jsonargparse's
deprecations, so that no warning hides behind Python's default filters; what the libraries say that
no user can act on is silenced in ``projkit.library_warnings`` or, where the kit made them say it,
fixed at the kit's call. A warning that is neither fails here, quoted with the command that printed it:
silence it there (naming the library, its version and why), fix the call, or, when it is about the
user's run, add it to ``USERS_OWN`` and to kit/docs/runs.md ("Warnings")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from projkit.testing import TINY_FIT, ServedExport, config, fit, write_png

pytestmark = pytest.mark.slow

# The warnings a user may see on these commands, each about their own run: what it says, why it helps.
USERS_OWN = {
    r"model\.init_args\.scheduler: warmup_steps=\d+ is not shorter than the run's \d+ optimizer steps": (
        "the schedule the config sets never reaches its learning rate in a run this short (TINY_FIT's two "
        "steps): lower warmup_steps or train longer"
    ),
    r"The number of training batches \(\d+\) is smaller than the logging interval": (
        "an epoch of so few batches logs no training metric: lower trainer.log_every_n_steps"
    ),
    r"--ckpt_path: the model is built from the checkpoint's own hyperparameters": (
        "a model setting given with --ckpt_path did not apply (the checkpoint's did): the run is not "
        "what the command line says"
    ),
    r"The '\w+_dataloader' does not have many workers": (
        "a loader of samples built one by one (files decoded) has fewer than 2 workers on a machine with "
        "cores to spare: raise data.init_args.num_workers (a whole-tensor dataset's loader goes without it)"
    ),
    r"GPU available but not used": (
        "the config trains on the CPU of a machine with a GPU: --trainer.accelerator=auto uses it"
    ),
}

# A warning as Python prints it (`file.py:12: UserWarning: ...`, Lightning's `file.py:12: ...`, or
# jsonargparse's message on the lines after), also after a progress bar's unfinished line; or a
# logging library's `WARNING` line.
WARNING = re.compile(r"(?P<where>[^\s:]+\.py:\d+): (?P<message>.*)$")
LOGGED = re.compile(r"^\s*WARNING\b")


def warnings_in(said: str) -> list[str]:
    """Each warning in a command's output: where it was raised, and its message's first line."""
    lines = said.splitlines()
    found = []
    for index, line in enumerate(lines):
        if match := WARNING.search(line):
            following = (text.strip() for text in lines[index + 1 : index + 4])
            message = match["message"].strip() or next((text for text in following if text), "")
            found.append(f"{match['where']}: {message}")
        elif LOGGED.match(line):
            found.append(line.strip())
    return found


def assert_only_the_users(args: list[str], said: str) -> None:
    """Every warning in ``said`` (what ``python -m tinyproj ARGS`` printed) is one ``USERS_OWN`` lists;
    the others are quoted with the command."""
    unlisted = [w for w in warnings_in(said) if not any(re.search(p, w) for p in USERS_OWN)]
    quoted = "\n".join(f"  {warning}" for warning in unlisted)
    command = shlex.join(["python", "-m", "tinyproj", *args])
    assert not unlisted, f"`{command}` printed warnings that are not about the user's run:\n{quoted}"


def user_environment() -> dict[str, str]:
    """This environment (tinyproj on PYTHONPATH), with every warning shown and user errors as a user
    sees them."""
    return {
        **os.environ,
        "PYTHONWARNINGS": "default",
        "JSONARGPARSE_DEPRECATION_WARNINGS": "all",
        "PROJ_DEBUG": "",
    }


def as_a_user(folder: Path, *args: str) -> str:
    """``python -m tinyproj ARGS`` in a new interpreter in ``folder``; what it printed, after checking
    that it ended well and warned only of the user's run."""
    command = [sys.executable, "-m", "tinyproj", *args]
    done = subprocess.run(
        command, cwd=folder, env=user_environment(), capture_output=True, text=True, timeout=300
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"`{shlex.join(command)}` exited {done.returncode}:\n{said[-3000:]}"
    return said


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A tiny fit, tested after: its folder, its last checkpoint, and what it printed."""
    folder = tmp_path_factory.mktemp("as_a_user")
    said = as_a_user(folder, "fit", "--config", config("classify.yaml"), *TINY_FIT)
    ckpt = folder / "runs" / "classify" / "version_0" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file(), said[-3000:]
    return folder, ckpt, said


@pytest.fixture(scope="module")
def exported(fitted) -> tuple[Path, str]:
    """``export`` of the fit's last checkpoint: the export folder, and what export printed."""
    folder, ckpt, _ = fitted
    said = as_a_user(folder, "export", "--config", config("classify.yaml"), f"--ckpt_path={ckpt}")
    export = ckpt.parent.parent / "export" / ckpt.stem
    assert (export / "model.onnx").is_file(), said[-3000:]
    return export, said


def test_fit_warns_only_of_the_users_run(fitted):
    _, _, said = fitted
    assert_only_the_users(["fit", "--config", config("classify.yaml"), *TINY_FIT], said)
    assert re.search(next(iter(USERS_OWN)), said), "precondition: the tiny fit's warmup warning is seen"


@pytest.mark.parametrize("subcommand", ["test", "predict"])
def test_an_evaluation_warns_only_of_the_users_run(fitted, subcommand):
    folder, ckpt, _ = fitted
    args = [subcommand, "--config", config("classify.yaml"), f"--ckpt_path={ckpt}"]
    assert_only_the_users(args, as_a_user(folder, *args))


def test_export_warns_only_of_the_users_run(fitted, exported):
    _, ckpt, _ = fitted
    _, said = exported
    assert_only_the_users(["export", "--config", config("classify.yaml"), f"--ckpt_path={ckpt}"], said)


def test_serve_warns_only_of_the_users_run(fitted, exported, monkeypatch):
    folder, _, _ = fitted
    export, _ = exported
    for name, value in user_environment().items():
        monkeypatch.setenv(name, value)
    image = folder / "one.png"
    write_png(image, np.full((4, 4), 128))
    server = ServedExport(str(export), cwd=str(folder)).start()
    try:
        status, answer = server.post(image.read_bytes(), "image/png")
    finally:
        code = server.stop()
    assert status == 200 and "class" in answer, answer
    assert code == 0, server.output[-3000:]
    assert_only_the_users(server.command[3:], server.output)


def test_lightning_suggests_loader_workers_only_where_they_help(workdir, monkeypatch, recwarn):
    """Lightning's hint to add loader workers, on a machine of 8 cores: for the loader of a per-item
    dataset (``per_item``: each sample built by ``__getitem__``), not for the whole-tensor ones."""
    import lightning.pytorch.trainer.connectors.data_connector as data_connector

    monkeypatch.setattr(data_connector, "suggested_max_num_workers", lambda devices: 7)
    per_item = ("--data.init_args.per_item=true", "--test_after_fit=false")
    fit("classify.yaml", extra=(*TINY_FIT, *per_item))
    said = "\n".join(str(caught.message) for caught in recwarn)
    hinted = sorted(re.findall(r"The '(\w+)' does not have many workers", said))
    assert hinted == ["train_dataloader"]

"""The kit's own test helpers: a tiny project (``tinyproj``, two tasks that train in seconds) whose
commands the tests run, in this process or as ``python -m tinyproj`` processes, and the overlays that
inject faults. Nothing here knows the template's example tasks: the kit is tested on its own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

# Under `make test-kit` each core runs a worker (pytest-xdist): one thread per process, set before
# torch is imported and inherited by the training processes tests start, keeps them from oversubscribing.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

HERE = Path(__file__).resolve().parent
KIT = HERE.parent
ROOT = KIT.parent
# tinyproj and the fault callbacks import from here, in the processes the tests start too.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

from projkit.context import use  # noqa: E402
from tinyproj import CONFIGS, PROJECT  # noqa: E402

# The kit's commands in this process (and those forked through projkit.preloaded) run for tinyproj.
use(PROJECT)

DEFAULTS = CONFIGS / "defaults.yaml"
# The two tasks, as the tests run them: the experiment's config and its run's name under runs/.
TASKS = {"image": ("classify.yaml", "classify"), "text": ("lm.yaml", "lm")}

# One epoch of two training batches, one batch each of validation and test, no progress bar.
TINY_FIT = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.enable_progress_bar=false",
)


def config(name: str) -> str:
    """The path of one of tinyproj's configs."""
    return str(CONFIGS / name)


def fit(*configs: str, extra: tuple[str, ...] = ()):
    """``fit`` in this process on tinyproj's configs ``configs`` (stacked in order), then ``extra``."""
    args = ["fit"]
    for name in configs:
        args += ["--config", config(name)]
    return PROJECT.main([*args, *extra])


def main(args, run: bool = True):
    """tinyproj's command line in this process (``python -m tinyproj ARGS``)."""
    return PROJECT.main(args, run)


def step_checkpoints(every: int) -> str:
    """An item of an overlay's ``trainer.callbacks+`` list: a checkpoint every ``every`` steps, named
    by its step (the experiment's ``LastCheckpoint`` keeps ``last.ckpt``)."""
    return f"""
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        every_n_train_steps: {every}
        filename: "step{{step:04d}}"
        auto_insert_metric_name: false
"""


def fault(class_name: str, **init_args) -> str:
    """The lines of an overlay's ``trainer.callbacks+:`` list that add ``faults.<class_name>``."""
    args = "".join(f"\n        {k}: {v}" for k, v in init_args.items())
    return f"    - class_path: faults.{class_name}\n      init_args:{args}\n"


def kill_at(step: int, group: bool = False, rank: int | None = None) -> str:
    """An item of an overlay's ``trainer.callbacks+`` list: SIGKILL at ``step`` (``group``: every
    rank of the job at once; ``rank``: that rank only)."""
    return f"""
    - class_path: projkit.testing.KillAtStep
      init_args:
        step: {step}
        group: {str(group).lower()}
        rank: {"null" if rank is None else rank}
"""


def write_png(path: Path, pixels: np.ndarray) -> None:
    """A grey PNG of ``pixels`` (0-255), its folders made as needed."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8)).save(path)


# The files that take longest, dealt first (`--dist loadfile` deals files in collection order), so
# that the short ones fill the workers beside them rather than one worker finishing alone.
LONGEST_FILES = ("test_ddp.py", "test_benchmarks.py", "test_sweep.py", "test_runs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FILES)


@pytest.fixture(autouse=True)
def debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process commands raise a user error as it was raised (``PROJ_DEBUG=1``), so a test can
    catch its type; the bad-input tests turn it off to see what a user sees."""
    monkeypatch.setenv("PROJ_DEBUG", "1")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so runs/ and data/ land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session", autouse=True)
def lightning_logs_to_the_session() -> None:
    """Lightning gives its loggers a handler on ``sys.stderr`` as it is when Lightning is first
    imported: imported here, before any test, it writes to the session's stream, not to the ``capsys``
    of the first test that runs a command, which closes with that test (a later test's ``stderr``
    then holds a ``--- Logging error ---`` traceback; test files run alone met it)."""
    import lightning.pytorch  # noqa: F401

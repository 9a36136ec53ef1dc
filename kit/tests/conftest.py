"""The kit's own test helpers: a tiny project (``tinyproj``, two tasks that train in seconds) whose
commands the tests run, in this process or as ``python -m tinyproj`` processes, and the overlays that
inject faults. Nothing here knows the template's example tasks: the kit is tested on its own. The
harness itself (short runs, launched processes, the bad-input runner, the fixtures) is the kit's
public ``projkit.testing``, which a project's tests use too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from projkit.testing.fixtures import one_thread_per_worker

one_thread_per_worker()

HERE = Path(__file__).resolve().parent
KIT = HERE.parent
ROOT = KIT.parent
# tinyproj and the fault callbacks import from here, in the processes the tests start too.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

from projkit.context import use  # noqa: E402
from projkit.testing.fixtures import (  # noqa: E402, F401 (the fixtures, made this folder's)
    debug,
    lightning_logs_to_the_session,
    longest_first,
    workdir,
)
from tinyproj import CONFIGS, PROJECT  # noqa: E402

# The kit's commands in this process (and those forked through projkit.preloaded) run for tinyproj;
# projkit.testing's helpers (config, fit, launch) run the current project, so tinyproj's.
use(PROJECT)

DEFAULTS = CONFIGS / "defaults.yaml"
# The two tasks, as the tests run them: the experiment's config and its run's name under runs/.
TASKS = {"image": ("classify.yaml", "classify"), "text": ("lm.yaml", "lm")}


def main(args, run: bool = True):
    """tinyproj's command line in this process (``python -m tinyproj ARGS``)."""
    return PROJECT.main(args, run)


def fault(class_name: str, **init_args) -> str:
    """The lines of an overlay's ``trainer.callbacks+:`` list that add ``faults.<class_name>``."""
    args = "".join(f"\n        {k}: {v}" for k, v in init_args.items())
    return f"    - class_path: faults.{class_name}\n" + (f"      init_args:{args}\n" if args else "")


# The files that take longest, dealt first, so that the short ones fill the workers beside them.
LONGEST_FILES = ("test_upgrade.py", "test_ddp.py", "test_benchmarks.py", "test_sweep.py", "test_runs.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items, LONGEST_FILES)


def seeded(examples: int) -> settings:
    """A fuzzer's hypothesis settings: ``examples`` cases, the same ones every run (``derandomize``), no
    deadline, no example database, and no health check (their fixtures build runs and servers)."""
    return settings(
        max_examples=examples, derandomize=True, deadline=None, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip

"""The test harness a project's tests use to try the kit's promises on their own code, and the kit's
tests on their tiny project: one copy, in the kit, so ``make upgrade-kit`` brings its fixes to a
project's tests. Nothing here imports a project's package; each helper runs the current project
(``projkit.context``, which a tests/conftest.py sets with ``use(PROJECT)``) or takes what it needs.

Imported from here (light: no pytest; the callbacks import Lightning when first named, so that a
conftest.py may import the harness before it sets the thread count torch reads):

- ``KillAtStep``, ``SyncCounter``: callbacks to name in an overlay (``projkit.testing.callbacks``).
- ``ServedExport``, ``free_port``: ``python -m <package> serve`` on a free port (``.served``).
- ``TINY_FIT``, ``config``, ``fit``, ``step_checkpoints``, ``kill_at``, ``write_png``: short runs of
  the project's configs, and the overlay items of a kill or of step checkpoints (``.runs``).

And from its modules, each for one kind of test:

- ``projkit.testing.launch``: ``python -m <package>`` in a process forked from a preloaded server.
- ``projkit.testing.fixtures``: the ``debug`` and ``workdir`` fixtures a conftest.py imports.
- ``projkit.testing.bad_input``: the runner of a table of bad-input rows (``Case``).
- ``projkit.testing.configs``: what a command's config files say, to check a setting's effect.
- ``projkit.testing.export``: a fit exported, its artifacts compared with its checkpoint.
- ``projkit.testing.cluster``: jobs on the local Slurm cluster and PostgreSQL of ``make cluster``.
- ``projkit.testing.code``: no import cycle, no function or module too long to read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from projkit.testing.runs import TINY_FIT, config, fit, kill_at, step_checkpoints, write_png

if TYPE_CHECKING:
    from projkit.testing.callbacks import KillAtStep, SyncCounter
    from projkit.testing.served import ServedExport, free_port

# Each name imported from its module when first asked for (``projkit.testing.KillAtStep`` in a config
# too): importing the package imports neither Lightning nor torch.
LAZY = {
    "KillAtStep": "callbacks",
    "SyncCounter": "callbacks",
    "ServedExport": "served",
    "free_port": "served",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(f"projkit.testing.{LAZY[name]}"), name)
    raise AttributeError(f"module 'projkit.testing' has no attribute {name!r}")


__all__ = [
    "TINY_FIT",
    "KillAtStep",
    "ServedExport",
    "SyncCounter",
    "config",
    "fit",
    "free_port",
    "kill_at",
    "step_checkpoints",
    "write_png",
]

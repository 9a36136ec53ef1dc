"""Short runs of the current project (``projkit.context``: the one its package or its tests'
conftest.py set with ``use``), for its tests: the flags of a tiny fit, its configs by name, ``fit`` in
the test's process, and the overlay items that checkpoint every few steps or kill a run at a step.

Nothing here names a project: a project's tests and the kit's own (on their tiny project) share them,
so a fix reaches both and ``make upgrade-kit`` brings it to a project's tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from projkit.context import current

if TYPE_CHECKING:
    import numpy as np

# One epoch of two training batches, one batch each of validation and test, no progress bar: a fit
# that runs every stage in seconds, for tests of what happens around training.
TINY_FIT = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.limit_test_batches=1",
    "--trainer.enable_progress_bar=false",
)


def configs_folder() -> Path:
    """The current project's configs folder: where its defaults file sits, beside its experiments."""
    return current().defaults.parent


def config(name: str) -> str:
    """The path of the current project's config ``name`` (``my_experiment.yaml``, ``debug/limit.yaml``),
    as ``--config`` takes it: a test names the shipped file, wherever the test runs from."""
    return str(configs_folder() / name)


def fit(*configs: str, extra: tuple[str, ...] = ()) -> Any:
    """``fit`` in this process on the project's configs ``configs`` (stacked in order), then the flags
    ``extra``: the CLI object, with its ``trainer``, ``model`` and ``datamodule`` to inspect."""
    args = ["fit"]
    for name in configs:
        args += ["--config", config(name)]
    return current().main([*args, *extra])


def step_checkpoints(every: int) -> str:
    """An item of an overlay's ``trainer.callbacks+`` list: a checkpoint every ``every`` steps, named
    by its step (the experiment's ``LastCheckpoint`` keeps ``last.ckpt``), for a test that compares
    the states a resumed run passes through with an uninterrupted run's."""
    return f"""
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        every_n_train_steps: {every}
        filename: "step{{step:04d}}"
        auto_insert_metric_name: false
"""


def kill_at(step: int, group: bool = False, rank: int | None = None) -> str:
    """An item of an overlay's ``trainer.callbacks+`` list: SIGKILL at ``step`` (``group``: every
    rank of the job at once; ``rank``: that rank only), as a node's death or the OOM killer would."""
    return f"""
    - class_path: projkit.testing.KillAtStep
      init_args:
        step: {step}
        group: {str(group).lower()}
        rank: {"null" if rank is None else rank}
"""


def write_png(path: Path, pixels: np.ndarray) -> None:
    """A grey PNG of ``pixels`` (0-255), its folders made as needed: image files written by the test,
    for the data modules that read folders of them."""
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.asarray(pixels).astype(np.uint8)).save(path)

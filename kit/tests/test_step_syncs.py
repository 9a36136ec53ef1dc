"""An ordinary training step of the default config (one that neither logs nor validates nor
checkpoints nor ends an epoch) makes the host wait for the device nowhere and issues no collective:
on a GPU either would stop its pipeline on every step. Counted on the CPU by
``projkit.testing.SyncCounter`` (``projkit.step_syncs`` says how), so a new one fails here. The
collectives of a DDP step are counted in tests/test_ddp.py, in its reference run."""

from __future__ import annotations

import pytest

from conftest import main
from projkit.testing import SyncCounter, config

# Logging every 3 steps of 7: the second, fourth and fifth steps are ordinary (the first, a logging
# step and the last, which ends training and checkpoints, are not).
STEPS = ("--trainer.max_steps=7", "--trainer.log_every_n_steps=3", "--trainer.limit_val_batches=2",
         "--trainer.num_sanity_val_steps=0", "--test_after_fit=false")  # fmt: skip
# A shorter play for the language model: its vocabulary takes seconds to index at the usual length.
SHORT = {"classify.yaml": (), "lm.yaml": ("--data.init_args.characters=4000",)}
COUNTER = "--trainer.callbacks+=projkit.testing.SyncCounter"


def report(windows: dict[int, list]) -> str:
    return "\n".join(f"batch {batch}: {event}" for batch, events in windows.items() for event in events)


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["classify.yaml", "lm.yaml"])
def test_an_ordinary_step_waits_for_the_device_nowhere(experiment, workdir):
    cli = main(["fit", "--config", config(experiment), *STEPS, *SHORT[experiment], COUNTER])
    counter = next(c for c in cli.trainer.callbacks if isinstance(c, SyncCounter))
    ordinary = {window.batch: window.events for window in counter.ordinary()}
    assert len(ordinary) >= 3, [(w.batch, sorted(w.special)) for w in counter.windows]
    assert not any(ordinary.values()), "per ordinary step:\n" + report(ordinary)

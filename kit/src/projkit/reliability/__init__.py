"""What keeps a long run's work safe: each piece guards against one way of losing it.

================================  ===========================================  ======================
piece                             guards against                               config key (defaults)
================================  ===========================================  ======================
``LastCheckpoint``                a killed run losing more than a few steps    ``last_checkpoint``
``AtomicCheckpointIO``            a kill mid-save leaving a truncated file     ``checkpoint_io``
``loads_weights_only``            a crafted checkpoint running code when it    always (the CLI passes
                                  is loaded: a checkpoint keeps only what      Lightning's
                                  ``weights_only=True`` reads back             ``weights_only=True``)
``ContainedState``                a crafted checkpoint making a resume delete  always (the CLI adds
                                  or write outside its run: each file its      it to every command)
                                  state names is checked, or dropped
``ExactResume``                   a resumed run drawing other random numbers   ``exact_resume``
                                  (dropout, augmentation), or repeating or
                                  losing rows of ``metrics.csv`` (a
                                  validation after a step checkpoint)
``TrainOrder``                    a resumed epoch seeing other samples, or     (data modules)
                                  repeating the ones before the checkpoint
``Preemption``                    SIGTERM/Ctrl-C (SLURM, torchrun) ending a    ``preemption``
                                  run without a checkpoint or with exit 0
``StopOnDivergence``              a NaN loss reaching the weights, or a        ``stop_on_divergence``
                                  diverged model overwriting the last good
                                  checkpoint
================================  ===========================================  ======================

``projkit/defaults.yaml`` switches each on under its key; ``--exact_resume=null`` (or ``key: null``
in a config) switches one off. ``TrainOrder`` is not a switch: it is the sampler the data modules
build their training loader with (``projkit.data.loaders.SplitLoaders``), and costs nothing when no
checkpoint is loaded. Nothing here is needed to follow a training step; all of it is needed for a
run that is killed, preempted or diverges to lose nothing.
"""

from projkit.reliability.checkpoint_io import (
    AtomicCheckpointIO,
    guard_checkpoints,
    loads_weights_only,
)
from projkit.reliability.contained import ContainedState
from projkit.reliability.divergence import DivergenceError, StopOnDivergence
from projkit.reliability.last_checkpoint import LastCheckpoint
from projkit.reliability.preemption import Preempted, Preemption
from projkit.reliability.resume import ExactResume, gather
from projkit.reliability.train_order import ResumableSampler, SeededItems, TrainOrder

__all__ = [
    "AtomicCheckpointIO",
    "ContainedState",
    "DivergenceError",
    "ExactResume",
    "LastCheckpoint",
    "Preempted",
    "Preemption",
    "ResumableSampler",
    "SeededItems",
    "StopOnDivergence",
    "TrainOrder",
    "gather",
    "guard_checkpoints",
    "loads_weights_only",
]

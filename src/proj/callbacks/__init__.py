"""Callbacks Lightning lacks."""

from proj.callbacks.divergence import DivergenceError, StopOnDivergence
from proj.callbacks.last_checkpoint import LastCheckpoint
from proj.callbacks.lr_monitor import LearningRateMonitor
from proj.callbacks.preemption import Preempted, Preemption
from proj.callbacks.resume import ExactResume
from proj.callbacks.throughput import TrainingThroughput
from proj.callbacks.tuning import BatchSizeFinder, LearningRateFinder
from proj.callbacks.validate_at_end import ValidateAtEnd

__all__ = [
    "BatchSizeFinder",
    "DivergenceError",
    "ExactResume",
    "LastCheckpoint",
    "LearningRateFinder",
    "LearningRateMonitor",
    "Preempted",
    "Preemption",
    "StopOnDivergence",
    "TrainingThroughput",
    "ValidateAtEnd",
]

"""Callbacks Lightning lacks."""

from proj.callbacks.divergence import DivergenceError, StopOnDivergence
from proj.callbacks.lr_monitor import LearningRateMonitor
from proj.callbacks.preemption import Preempted, Preemption
from proj.callbacks.resume import ExactResume
from proj.callbacks.throughput import TrainingThroughput
from proj.callbacks.tuning import BatchSizeFinder, LearningRateFinder

__all__ = [
    "BatchSizeFinder",
    "DivergenceError",
    "ExactResume",
    "LearningRateFinder",
    "LearningRateMonitor",
    "Preempted",
    "Preemption",
    "StopOnDivergence",
    "TrainingThroughput",
]

"""Callbacks Lightning lacks."""

from proj.callbacks.divergence import DivergenceError, StopOnDivergence
from proj.callbacks.preemption import Preempted, Preemption
from proj.callbacks.resume import ExactResume
from proj.callbacks.throughput import TrainingThroughput

__all__ = [
    "DivergenceError",
    "ExactResume",
    "Preempted",
    "Preemption",
    "StopOnDivergence",
    "TrainingThroughput",
]

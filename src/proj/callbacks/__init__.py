"""Callbacks Lightning lacks, and the prediction writers built on its ``BasePredictionWriter``."""

from proj.callbacks.divergence import DivergenceError, StopOnDivergence
from proj.callbacks.last_checkpoint import LastCheckpoint
from proj.callbacks.lr_monitor import LearningRateMonitor
from proj.callbacks.prediction_writer import (
    ClassPredictionWriter,
    PredictionFileWriter,
    TextPredictionWriter,
    writer_when_predicting,
)
from proj.callbacks.preemption import Preempted, Preemption
from proj.callbacks.pruning import OptunaPruning
from proj.callbacks.resume import ExactResume
from proj.callbacks.throughput import TrainingThroughput
from proj.callbacks.tuning import BatchSizeFinder, LearningRateFinder
from proj.callbacks.validate_at_end import ValidateAtEnd

__all__ = [
    "BatchSizeFinder",
    "ClassPredictionWriter",
    "DivergenceError",
    "ExactResume",
    "LastCheckpoint",
    "LearningRateFinder",
    "LearningRateMonitor",
    "OptunaPruning",
    "PredictionFileWriter",
    "Preempted",
    "Preemption",
    "StopOnDivergence",
    "TextPredictionWriter",
    "TrainingThroughput",
    "ValidateAtEnd",
    "writer_when_predicting",
]

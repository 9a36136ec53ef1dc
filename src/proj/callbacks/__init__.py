"""Callbacks Lightning lacks, and the prediction writers built on its ``BasePredictionWriter``.
(What keeps a run safe from kills, preemption and divergence is in ``proj.reliability``.)"""

from proj.callbacks.prediction_writer import (
    ClassPredictionWriter,
    PredictionFileWriter,
    TextPredictionWriter,
    writer_when_predicting,
)
from proj.callbacks.pruning import OptunaPruning
from proj.callbacks.throughput import TrainingThroughput
from proj.callbacks.tuning import BatchSizeFinder, LearningRateFinder
from proj.callbacks.validate_at_end import ValidateAtEnd

__all__ = [
    "BatchSizeFinder",
    "ClassPredictionWriter",
    "LearningRateFinder",
    "OptunaPruning",
    "PredictionFileWriter",
    "TextPredictionWriter",
    "TrainingThroughput",
    "ValidateAtEnd",
    "writer_when_predicting",
]

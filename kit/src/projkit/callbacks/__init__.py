"""Callbacks Lightning lacks, and the prediction writers built on its ``BasePredictionWriter``.
(What keeps a run safe from kills, preemption and divergence is in ``projkit.reliability``.)"""

from projkit.callbacks.prediction_writer import (
    ClassPredictionWriter,
    PredictionFileWriter,
    TextPredictionWriter,
    writer_when_predicting,
)
from projkit.callbacks.pruning import OptunaPruning
from projkit.callbacks.throughput import TrainingThroughput
from projkit.callbacks.tuning import BatchSizeFinder, LearningRateFinder
from projkit.callbacks.validate_at_end import ValidateAtEnd

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

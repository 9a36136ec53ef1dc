"""LightningModules: one per task, each training whatever plain network it is given."""

from projkit.task import TaskModule

from proj.models.image_classifier import ImageClassifier
from proj.models.language_model import LanguageModel

__all__ = ["ImageClassifier", "LanguageModel", "TaskModule"]

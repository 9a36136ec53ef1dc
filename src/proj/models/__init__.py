"""LightningModules: one per task, each training whatever plain network it is given."""

from proj.models.image_classifier import ImageClassifier
from proj.models.language_model import LanguageModel
from proj.models.task import TaskModule

__all__ = ["ImageClassifier", "LanguageModel", "TaskModule"]

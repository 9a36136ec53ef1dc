"""Callbacks Lightning lacks."""

from proj.callbacks.preemption import Preempted, Preemption
from proj.callbacks.resume import ExactResume

__all__ = ["ExactResume", "Preempted", "Preemption"]

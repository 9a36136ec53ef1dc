"""Callbacks Lightning lacks."""

from proj.callbacks.resume import ExactResume

__all__ = ["ExactResume"]

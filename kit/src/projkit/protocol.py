"""What the kit asks of a project's classes, declared in one place and checked where a command needs
it: a member an owner's class lacks is a one-line refusal naming the class, the member and the page
that shows how to add it, never a default that would answer differently from the owner's own code.

kit/README.md ("What a project provides") lists these members; a test holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from projkit.errors import ConfigError


@dataclass(frozen=True)
class Member:
    """A member the kit reads from a project's ``role`` class (``model`` or ``data``), for
    ``commands``; ``what`` says what it is, ``page`` where it is shown."""

    role: str
    name: str
    commands: str
    what: str
    page: str = "kit/README.md, 'What a project provides'"

    def of(self, obj: Any, command: str) -> Any:
        """``obj``'s member, or a one-line refusal (exit 2) naming the class and how to add it."""
        value = getattr(obj, self.name, None)
        if value is None:
            kind = type(obj)
            raise ConfigError(
                f"{command}: {self.role} class {kind.__module__}.{kind.__qualname__} has no "
                f"`{self.name}`, which {self.commands} needs ({self.what}). Add it: {self.page}."
            )
        return value


LOSS = Member("model", "loss", "every stage", "loss(logits, targets, reduction): the loss of a batch")
DEPLOYABLE = Member(
    "model",
    "deployable",
    "export and serve",
    "deployable(datamodule) returning a projkit.deploy.Deployable: what the artifacts compute",
    "kit/docs/export.md",
)
MEAN = Member("data", "mean", "an image model's export", "the per-channel mean its batches are normalised by")
STD = Member("data", "std", "an image model's export", "the per-channel std its batches are normalised by")
PREPROCESSING = Member(
    "data",
    "preprocessing",
    "an image model's export and serve",
    "a projkit.preprocessing.Preprocessing saying how a file becomes the model's pixels, as predict "
    "prepares it; without it a deployment would prepare files differently and answer differently",
    "kit/docs/export.md, 'Preprocessing'",
)
STREAM_ITEMS = Member(
    "data",
    "stream_items",
    "optimize",
    "stream_items(split) yielding the samples of 'train', 'val' or 'test' as the module reads them "
    "back from chunks (stream_kind 'tokens': 1-D token tensors, cut into windows when read)",
    "kit/docs/streaming.md",
)
INPUT_SHAPE = Member("data", "input_shape", "an image model's export", "(C, H, W) of the model's input")

# Everything the kit reads from a project's classes, for kit/README.md's list and its test.
PROTOCOL = (LOSS, DEPLOYABLE, MEAN, STD, PREPROCESSING, INPUT_SHAPE, STREAM_ITEMS)

"""What a task hands ``export``: the network to trace, the input it takes and ``model.json``'s
description. A task module says how it is deployed by defining ``deployable(datamodule)``, usually
with one of the two kinds here: an image classifier that takes pixels (``pixel_classifier``) or a
next-token model that takes token ids (``token_model``). Both need only what the model and the
data module's settings state, never the data itself: ``export`` checks the artifacts on seeded
inputs they make (``Deployable.examples``), so a training folder is neither needed nor read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from projkit.errors import ConfigError
from projkit.preprocessing import Preprocessing
from projkit.protocol import INPUT_SHAPE, MEAN, PREPROCESSING, STD

__all__ = ["Deployable", "PixelInput", "Preprocessing", "pixel_classifier", "token_model"]
# How many seeded inputs `examples` makes for export's check: an odd size and a single one are cut from it.
EXAMPLES = 8


@dataclass
class Deployable:
    """``net`` is what the artifacts compute; ``inputs`` turns a batch the task module takes (after
    ``on_after_batch_transfer``) into ``net``'s input; ``description`` goes into ``model.json``;
    ``max_length``, for token ids, the longest sequence the exported graph accepts (the second
    dimension is dynamic up to it); ``examples(n)``, ``n`` seeded inputs of the task module's own
    kind, made without data, on which ``export`` compares the artifacts with the checkpoint (without
    it, export reads a batch of the data's test split)."""

    net: nn.Module
    inputs: Callable[[torch.Tensor], torch.Tensor]
    description: dict[str, Any] = field(default_factory=dict)
    max_length: int | None = None
    examples: Callable[[int], torch.Tensor] | None = None


class PixelInput(nn.Module):
    """``net`` behind the data's normalisation: float pixels in [0, 1], ``(N, C, H, W)``, in;
    ``net``'s output out.

    The normalisation is the same arithmetic as the data modules' (subtract ``mean``, divide by
    ``std``, per channel), so the logits equal those of ``net`` on the data's own batches: whoever
    runs the exported model cannot forget or mismatch the normalisation its weights were trained with.
    """

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.net((pixels - self.mean) / self.std)


def pixel_classifier(
    net: nn.Module, datamodule: Any, num_classes: int, classes: Sequence[str] | None = None
) -> Deployable:
    """An image classifier's ``net`` behind the data's normalisation (``datamodule.mean`` and
    ``std``, per channel), taking pixels in [0, 1] of ``datamodule.input_shape``; ``classes`` as the
    checkpoint names them, else the data module's. ``model.json`` states the data's
    ``preprocessing`` (a ``Preprocessing``; a data module without one is refused, as any default could
    prepare files differently from its own ``predict``), so a deployment prepares a file as ``predict``
    does."""
    mean, std = MEAN.of(datamodule, "export"), STD.of(datamodule, "export")
    classes = classes or getattr(datamodule, "classes", None)
    shape = list(INPUT_SHAPE.of(datamodule, "export"))
    preprocessing = PREPROCESSING.of(datamodule, "export")
    if list(preprocessing.output_size) != shape[:0:-1]:
        raise ConfigError(
            f"data ({type(datamodule).__name__}): its preprocessing gives {preprocessing.output_size} "
            f"(width, height) images, but the model takes input_shape {tuple(shape)}: make them agree."
        )
    description = {
        "task": "image classification",
        "input": {"name": "pixels", "shape": ["N", *shape], "dtype": "float32", "range": [0.0, 1.0]},
        "output": {"name": "logits", "shape": ["N", num_classes]},
        "classes": list(map(str, classes)) if classes else [str(i) for i in range(num_classes)],
        "normalisation": {"mean": list(mean), "std": list(std), "inside_graph": True},
        "preprocessing": preprocessing.describe(),
        "usage": (
            "each image file prepared as `preprocessing` says (its `steps`), batched N×C×H×W; "
            "softmax(logits) gives each class's probability"
        ),
    }
    wrapped = PixelInput(net, mean, std).eval()

    def examples(n: int) -> torch.Tensor:
        levels = preprocessing.levels
        generator = torch.Generator().manual_seed(0)
        pixels = torch.randint(0, levels + 1, (n, *shape), generator=generator).float() / levels
        return (pixels - wrapped.mean) / wrapped.std

    return Deployable(wrapped, lambda x: x * wrapped.std + wrapped.mean, description, examples=examples)


def token_model(net: nn.Module, vocab: str, block_size: int) -> Deployable:
    """A next-token ``net`` on int64 token ids ``(N, T)``, any ``T`` up to ``block_size``; token id
    ``i`` is the character ``vocab[i]``."""
    description = {
        "task": "next-token prediction",
        "input": {"name": "tokens", "shape": ["N", "T"], "dtype": "int64", "max_T": block_size},
        "output": {"name": "logits", "shape": ["N", "T", len(vocab)]},
        "vocab": vocab,
        "usage": "token id i is the character vocab[i]; logits[:, -1] scores the next character",
    }

    def examples(n: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, len(vocab), (n, block_size), generator=generator)

    return Deployable(net, lambda x: x, description, max_length=block_size, examples=examples)

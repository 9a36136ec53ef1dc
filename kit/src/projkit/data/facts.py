"""The data module's facts (class count and names, input shape, vocabulary): linked into the model
and its network as the classes are built, so a config states none of them twice, and taken from the
checkpoint by a command that reads one when the data's files can no longer give them."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from projkit.data.names import printable_names
from projkit.errors import ConfigError

NET = "model.init_args.net.init_args"
FACTS = (
    ("num_classes", "model.init_args.num_classes"),
    ("num_classes", f"{NET}.num_classes"),
    ("classes", "model.init_args.classes"),
    ("input_shape", f"{NET}.input_shape"),
    ("vocab", "model.init_args.vocab"),
    ("vocab_size", f"{NET}.vocab_size"),
)

_saved: ContextVar[dict[str, Any] | None] = ContextVar("saved_facts", default=None)


def link_data_facts(parser: LightningArgumentParser) -> None:
    """Link each of ``FACTS`` from the data module into the model, read when the classes are built.
    A link whose source the chosen data module lacks, or whose target the chosen model lacks, is
    skipped: image and text share them."""
    for fact, target in FACTS:
        # Folder names may hold bytes that are not UTF-8: the model, its config and checkpoints
        # take them as text that YAML reads back.
        named = {"compute_fn": printable_names} if fact == "classes" else {}
        parser.link_arguments(f"data.{fact}", target, apply_on="instantiate", **named)


def use_checkpoint_facts(checkpoint: dict | None) -> None:
    """The facts the command's checkpoint was trained with (none without one), for ``file_fact``."""
    hparams = (checkpoint or {}).get("hyper_parameters") or {}
    net = hparams.get("net") if isinstance(hparams.get("net"), dict) else {}
    facts = {**(net.get("init_args") or {}), **hparams}
    _saved.set({fact: facts[fact] for fact, _ in FACTS if facts.get(fact) is not None})


def checkpoint_fact(name: str) -> Any:
    """The fact ``name`` as the command's checkpoint states it; None without a checkpoint or that
    fact. For a data module whose files are fetched (downloaded) when absent: with the checkpoint's
    fact at hand, ``export`` and ``predict`` need neither the files nor the network."""
    saved = (_saved.get() or {}).get(name)
    return tuple(saved) if isinstance(saved, list) else saved


class file_fact(property):
    """A data module's fact read from its files, such as class names from folder names. A command
    that reads a checkpoint (predict, test, export, a resume) takes it from the checkpoint where the
    files are gone or changed so that they cannot give it: the weights were trained for the
    checkpoint's classes, and export and predict need no training data. Without a checkpoint, the
    data's own refusal stands."""

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        try:
            return super().__get__(instance, owner)
        except (OSError, ConfigError):
            saved = checkpoint_fact(self.fget.__name__)
            if saved is None:
                raise
            return saved

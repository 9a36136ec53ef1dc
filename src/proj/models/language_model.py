from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import Callback
from projkit.callbacks.prediction_writer import TextPredictionWriter, writer_when_predicting
from projkit.checks.checkpoint import check_fits_model, read_weights
from projkit.deploy import Deployable, token_model
from projkit.errors import ConfigError
from projkit.logger_media import log_texts
from projkit.sampling import check_temperature
from projkit.task import TaskModule
from torch import nn
from torch.nn import functional as F
from torchmetrics import MeanMetric

from proj.data.text import CharTokenizer

GENERATION_SETTINGS = (
    "sample_prompt",
    "sample_tokens",
    "num_samples",
    "predict_tokens",
    "temperature",
    "top_k",
)


class LanguageModel(TaskModule):
    """Trains a next-token network (such as ``proj.nets.GPT``) on characters with cross-entropy.

    Logs ``train/loss``, ``val/loss`` and ``val/ppl`` (perplexity, exp of the epoch's mean loss),
    ``test/loss`` and ``test/ppl`` (speed and memory: ``projkit.callbacks.TrainingThroughput`` in the
    experiment config). After each validation, ``num_samples`` texts of ``sample_tokens`` characters
    continuing ``sample_prompt`` go to TensorBoard, W&B, or ``samples.txt`` in the run directory.
    ``predict`` continues each of the data's prompts by ``predict_tokens`` characters, prints the
    texts and writes them to ``predictions.jsonl`` in the run directory (``TextPredictionWriter``).

    ``vocab`` (linked from the data module by the CLI) is stored in the checkpoint, so a checkpoint
    decodes on its own: ``LanguageModel.load_from_checkpoint(path).generate("ROMEO:", 200)``.

    Fine-tuning starts from a checkpoint's weights with a fresh optimizer and schedule::

        python -m proj fit --config configs/shakespeare_char_cpu.yaml \\
            --model.init_args.init_from=runs/shakespeare_char_cpu/version_0/checkpoints/last.ckpt \\
            --model.init_args.freeze='["net.transformer.wte.*", "net.transformer.h.0.*"]'

    whereas ``--ckpt_path`` resumes an interrupted run: optimizer state, schedule and step included.
    ``freeze`` takes glob patterns over parameter names; matching parameters stop training and are
    left out of the optimizer. GPT's output layer shares the token embedding, so freezing
    ``net.transformer.wte.*`` freezes both.
    """

    data_facts = ("vocab", "vocab_size")

    def __init__(
        self,
        net: nn.Module,
        vocab: str,
        freeze: Sequence[str] = (),
        init_from: str | None = None,
        sample_prompt: str = "\n",
        sample_tokens: int = 200,
        num_samples: int = 1,
        predict_tokens: int = 500,
        temperature: float = 1.0,
        top_k: int | None = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: ``TaskModule``'s settings (optimizer, scheduler, compile, ...), which the CLI and
        ``--help`` list too."""
        super().__init__(net, **kwargs)
        self.save_plain_hyperparameters()
        # A checkpoint holds the weights init_from named: loading it must not need that file again.
        # Generation settings are no property of the weights, and the CLI lets a checkpoint's
        # hyperparameters override the command line, so they stay out for `predict` to set.
        self.remove_ignored_hparams(["init_from", *GENERATION_SETTINGS])
        self.tokenizer = CharTokenizer(vocab)
        temperature = check_generation(sample_tokens, num_samples, predict_tokens, temperature, top_k)
        self.check_prompt(sample_prompt, "model.sample_prompt")
        self.sample_prompt = sample_prompt
        self.sample_tokens = sample_tokens
        self.num_samples = num_samples
        self.predict_tokens = predict_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")
        if init_from is not None:
            self.load_weights(init_from)
        self.freeze_parameters(freeze)

    @property
    def vocab(self) -> str:
        return self.tokenizer.vocab

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.net(idx)

    def loss(
        self, logits: torch.Tensor, targets: torch.Tensor, reduction: Literal["mean", "none"] = "mean"
    ) -> torch.Tensor:
        """Next-token cross-entropy of logits ``(B, T, vocab)`` against targets ``(B, T)``; one value
        per token, flattened, for ``reduction="none"`` (see ``TaskModule.loss``). Override it to
        train with another loss: every stage uses it."""
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(self(x), y)
        # Only where the loggers receive it: each self.log call costs about a millisecond of Python.
        if self.is_logging_step():
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def logged_metrics(self) -> set[str]:
        return super().logged_metrics() | {"val/ppl", "test/ppl"}

    def example_input(self) -> torch.Tensor | None:
        return torch.zeros(2, self.net.block_size, dtype=torch.long)

    def setup(self, stage: str) -> None:
        super().setup(stage)
        # A model loaded from a checkpoint knows its characters; the data must encode the same ones.
        data_vocab = getattr(self.trainer.datamodule, "vocab", None)
        if isinstance(data_vocab, str):
            check_same_vocab(self.vocab, data_vocab)
        if stage == "predict":
            for index, prompt in enumerate(getattr(self.trainer.datamodule, "predict_prompts", ())):
                self.check_prompt(prompt, f"data.predict_prompts[{index}]")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Under the CLI the vocabulary is linked from the data, so --ckpt_path on another text
        # shows only here.
        saved = checkpoint.get("hyper_parameters", {}).get("vocab")
        if isinstance(saved, str):
            check_same_vocab(saved, self.vocab)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        # Every token counts once, in a short last batch too. Per-token values rather than a batch
        # mean with ``weight=``: ``nan_strategy="disable"`` (which spares a host sync per batch)
        # makes MeanMetric ignore weights.
        x, y = batch
        self.val_loss.update(self.loss(self(x), y, reduction="none"))

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", loss.exp())
        if self.num_samples > 0 and not (self.trainer.sanity_checking or self.trainer.fast_dev_run):
            self.log_samples()

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.test_loss.update(self.loss(self(x), y, reduction="none"))

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.test_loss.reset()
        self.log("test/loss", loss)
        self.log("test/ppl", loss.exp())

    def predict_step(self, batch: list[str], batch_idx: int) -> list[str]:
        return [self.generate(p, self.predict_tokens, self.temperature, self.top_k) for p in batch]

    def configure_callbacks(self) -> list[Callback]:
        # `predict` prints each continuation and writes predictions.jsonl into the run directory.
        return writer_when_predicting(self, TextPredictionWriter)

    def deployable(self, datamodule: Any) -> Deployable:
        """What ``export`` writes: the network on token ids, up to its ``block_size``."""
        return token_model(self.net, self.vocab, self.net.block_size)

    def check_prompt(self, prompt: str, name: str = "prompt") -> None:
        if not prompt:
            raise ConfigError(f"{name} is empty: it needs at least one character to continue, e.g. '\\n'.")
        missing = self.tokenizer.unknown(prompt)
        if missing:
            shown = ", ".join(repr(c) for c in missing[:10])
            raise ConfigError(
                f"{name}: characters {shown} are not in the model's vocabulary of {len(self.vocab)} "
                f"characters, which comes from its training text: {self.vocab[:100]!r}. "
                "Use only characters of that text."
            )

    def generate(
        self, prompt: str, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> str:
        """The prompt followed by ``max_new_tokens`` sampled characters.

        ``temperature`` 0 takes the most likely character each time (any other must be in
        ``projkit.sampling``'s range, which keeps logits / temperature finite); ``top_k`` samples
        among the k most likely only. Sampling draws from torch's global RNG, so seeding it repeats
        a text.
        """
        temperature = check_temperature(temperature)
        self.check_prompt(prompt)
        idx = self.tokenizer.encode(prompt).to(self.device).unsqueeze(0)
        block_size = self.net.block_size
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                for _ in range(max_new_tokens):
                    logits = self.net(idx[:, -block_size:])[:, -1, :].float()
                    if temperature == 0:
                        next_id = logits.argmax(dim=-1, keepdim=True)
                    else:
                        logits = logits / temperature
                        if top_k is not None:
                            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                            logits = logits.masked_fill(logits < kth, float("-inf"))
                        next_id = torch.multinomial(logits.softmax(dim=-1), num_samples=1)
                    idx = torch.cat((idx, next_id), dim=1)
        finally:
            self.train(was_training)
        return self.tokenizer.decode(idx[0])

    def log_samples(self) -> None:
        """Generate and record samples on rank zero, without moving the training RNG streams."""
        if not self.trainer.is_global_zero:
            return
        cuda = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            texts = [
                self.generate(self.sample_prompt, self.sample_tokens, self.temperature, self.top_k)
                for _ in range(self.num_samples)
            ]
        log_texts(self.loggers, "samples", texts, self.global_step, self.trainer.default_root_dir)

    def load_weights(self, path: str) -> None:
        """Start from another run's weights, refusing one trained on different characters: its
        embedding rows would mean other characters than this data's."""
        checkpoint = read_weights(path, "model.init_from")
        theirs = (checkpoint.get("hyper_parameters") or {}).get("vocab")
        if theirs != self.vocab:
            raise ValueError(
                f"model.init_from: the vocabulary of '{path}' differs from the data's "
                f"({vocab_difference(theirs, self.vocab)}). "
                "Fine-tune on the text the checkpoint was trained on (the same characters), or "
                "train from scratch without init_from."
            )
        check_fits_model(checkpoint, self, "model.init_from", path)
        self.load_state_dict(checkpoint["state_dict"])

    def freeze_parameters(self, patterns: Sequence[str]) -> None:
        names = [name for name, _ in self.named_parameters()]
        for pattern in patterns:
            matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
            if not matched:
                raise ValueError(
                    f"model.freeze: pattern {pattern!r} matches no parameter. Names look like: "
                    f"{', '.join(names[:4])}, …, {names[-1]}."
                )
            for name in matched:
                self.get_parameter(name).requires_grad_(False)
        if names and not any(p.requires_grad for p in self.parameters()):
            raise ValueError(
                f"model.freeze: the patterns match every parameter ({', '.join(map(repr, patterns))}), "
                "so nothing would train. Freeze some layers only, e.g. '[\"net.transformer.wte.*\"]'."
            )


def check_generation(
    sample_tokens: int, num_samples: int, predict_tokens: int, temperature: float, top_k: int | None
) -> float:
    """Refuse generation settings that would fail only when the first sample is drawn; the
    temperature, checked by the kit's rule (``projkit.sampling``: 0, or a number the division of
    logits by it keeps finite)."""
    for name, value in (
        ("sample_tokens", sample_tokens),
        ("num_samples", num_samples),
        ("predict_tokens", predict_tokens),
    ):
        if value < 0:
            raise ValueError(f"model.{name} must be >= 0, got {value}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"model.top_k must be a positive integer or null (no cut), got {top_k}")
    return check_temperature(temperature, "model.temperature")


def check_same_vocab(checkpoint_vocab: str, data_vocab: str) -> None:
    """Refuse a checkpoint on a text of other characters: with as many characters it would load
    and silently read every character as another."""
    if checkpoint_vocab == data_vocab:
        return
    difference = vocab_difference(checkpoint_vocab, data_vocab)
    raise ConfigError(
        f"The checkpoint's vocabulary differs from the data's ({difference}): "
        "a checkpoint only works on the characters it was trained on. Point data.init_args.path at "
        "the text the checkpoint was trained on, or train on this text without --ckpt_path."
    )


def vocab_difference(theirs: object, ours: str) -> str:
    """How a checkpoint's vocabulary (``theirs``) differs from the data's, for error messages."""
    if not isinstance(theirs, str):
        return "the checkpoint stores none"
    extra = "".join(sorted(set(theirs) - set(ours)))
    missing = "".join(sorted(set(ours) - set(theirs)))
    return (
        f"{len(theirs)} characters against {len(ours)}; only in the checkpoint: {extra!r}, "
        f"only in the data: {missing!r}"
    )

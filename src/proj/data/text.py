"""Character-level language modelling data: one text file, one integer tensor, windows cut from it."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from projkit.data import checks
from projkit.data.facts import checkpoint_fact
from projkit.data.loaders import SplitLoaders
from projkit.errors import ConfigError
from projkit.reliability import TrainOrder
from torch.utils.data import DataLoader, Dataset

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


class CharTokenizer:
    """Maps each character of ``vocab`` (a string of distinct characters) to its position in it.

    The vocabulary is a plain string so that a checkpoint can store it among its hyperparameters
    and decode on its own, with no file beside it.
    """

    def __init__(self, vocab: str) -> None:
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not repeat a character")
        self.vocab = vocab
        self._index = {c: i for i, c in enumerate(vocab)}
        # Code point -> token id, so a whole text is encoded by one indexing operation.
        self._table = torch.zeros(max(map(ord, vocab), default=0) + 1, dtype=torch.long)
        self._table[[ord(c) for c in vocab]] = torch.arange(len(vocab))

    def __len__(self) -> int:
        return len(self.vocab)

    def unknown(self, text: str) -> list[str]:
        """The characters of ``text`` outside the vocabulary, each once, in order of appearance."""
        return [c for c in dict.fromkeys(text) if c not in self._index]

    def encode(self, text: str) -> torch.Tensor:
        missing = self.unknown(text)
        if missing:
            raise ValueError(f"characters outside the vocabulary: {_show(missing)}")
        code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        return self._table[torch.from_numpy(code_points)]

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return "".join(self.vocab[i] for i in ids)


class TokenWindows(Dataset):
    """Windows of ``block_size + 1`` tokens from one 1-D tensor, as inputs ``x = w[:-1]`` and
    next-token targets ``y = w[1:]``.

    Item ``i`` is the window starting at ``starts[i]``, or at ``i`` when ``starts`` is None (every
    start). ``__getitems__`` cuts a whole batch with one gather, so pair it with ``collate=keep_batch``.
    Tokens stay in their compact stored dtype until a batch is cut.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, starts: torch.Tensor | None = None) -> None:
        self.tokens = tokens
        self.starts = starts
        self.offsets = torch.arange(block_size + 1)

    def __len__(self) -> int:
        if self.starts is not None:
            return len(self.starts)
        return len(self.tokens) - len(self.offsets) + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.as_tensor(indices)
        if self.starts is not None:
            starts = self.starts[starts]
        windows = self.tokens[starts.unsqueeze(1) + self.offsets].long()
        return windows[:, :-1], windows[:, 1:]


class TextDataModule(SplitLoaders, LightningDataModule):
    """Next-character prediction on one UTF-8 text file (Tiny Shakespeare by default).

    The vocabulary is the sorted set of the file's characters. The CLI links it (``vocab``,
    ``vocab_size``) into the model when it instantiates this module, before ``prepare_data`` runs:
    the network's size depends on the data, so the file is read, and downloaded from ``url`` if it
    is absent, as soon as the vocabulary is asked for. A command that reads a checkpoint (export,
    predict, test) takes the checkpoint's vocabulary instead where the file is absent, and export and
    predict, which read no text, download nothing. ``sha256`` is checked on a download only, so
    ``path`` may point at any text of your own (set ``url`` to null to forbid downloading).

    The first ``train_fraction`` of the text trains, the rest validates. A training epoch is
    ``len(train) // block_size`` windows at distinct random starts, drawn by a sampler seeded with
    the run's seed and the epoch, so runs repeat and a resumed run continues the same draw.
    Validation uses fixed windows whose targets do not overlap (``val_windows`` of them spread
    evenly over the split, or all), so ``val/loss`` is comparable across runs. Test uses the same
    split and windowing, with every window.
    ``predict`` yields the ``predict_prompts`` strings in batches for the model to continue.
    """

    def __init__(
        self,
        path: str = "data/tinyshakespeare/input.txt",
        url: str | None = TINY_SHAKESPEARE_URL,
        sha256: str | None = TINY_SHAKESPEARE_SHA256,
        block_size: int = 256,
        batch_size: int = 64,
        train_fraction: float = 0.9,
        val_windows: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        predict_prompts: Sequence[str] = ("\n",),
        stream_from: str | None = None,
    ) -> None:
        super().__init__()
        checks.positive("block_size", block_size)
        checks.loader_settings(batch_size, num_workers)
        checks.fraction("train_fraction", train_fraction)
        if val_windows is not None:
            checks.positive("val_windows", val_windows, " or null (all)")
        if isinstance(predict_prompts, str) or not predict_prompts:
            raise ValueError(
                f"data.predict_prompts is empty or a single string ({predict_prompts!r}): it takes a list "
                """of prompts to continue, e.g. --data.init_args.predict_prompts='["ROMEO:"]'."""
            )
        for index, prompt in enumerate(predict_prompts):
            if not prompt:
                raise ValueError(
                    f"data.predict_prompts[{index}] is empty: each prompt needs at least one character "
                    "to continue, e.g. '\\n'."
                )
        self.save_hyperparameters()
        self.path = Path(path)
        self.predict_prompts = list(predict_prompts)
        self._text: str | None = None
        self._vocab: str | None = None
        self.splits: dict[str, TokenWindows] = {}
        self.train_order = TrainOrder()

    @property
    def text(self) -> str:
        if self._text is None:
            self.fetch()
            self._text = self.read()
        return self._text

    @property
    def vocab(self) -> str:
        if self._vocab is None and self.hparams.stream_from:
            self._vocab = self.stream_record(self.hparams.stream_from)["facts"]["vocab"]
        if self._vocab is None:
            saved = checkpoint_fact("vocab")
            if saved is not None and not self.path.is_file():
                # The checkpoint's characters, not a download: the text itself is only for
                # training and evaluation, which fetch it in prepare_data.
                return saved
            self._vocab = "".join(sorted(set(self.text)))
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer(self.vocab)

    def prepare_data(self) -> None:
        """Lightning's hook before each stage: the text, downloaded if absent. ``predict`` continues
        the prompts and reads no text, so it downloads nothing."""
        trainer = self.trainer
        if self.hparams.stream_from or (trainer is not None and trainer.state.fn == TrainerFn.PREDICTING):
            return
        self.fetch()

    def fetch(self) -> None:
        """The text file at ``path``, downloaded from ``url`` if it is absent; a folder, a device
        or a missing file without ``url`` is refused with the fix."""
        if self.path.is_dir():
            raise ValueError(
                f"data.path: '{self.path}' is a folder, not a text file. Point data.init_args.path at "
                "the file itself (e.g. data/tinyshakespeare/input.txt)."
            )
        if self.path.is_file():
            return
        if self.path.exists():  # a device (/dev/zero), a FIFO or a socket: no download goes there
            raise ConfigError(
                f"data.path: '{self.path}' is not a regular file (a device, pipe or socket), so it "
                "cannot be read as a text, nor downloaded into. Point data.init_args.path at a text file."
            )
        if self.hparams.url is None:
            raise FileNotFoundError(
                f"data.path: no text file at '{self.path}', and data.url is null so nothing is "
                "downloaded. Put a UTF-8 text file there, or point data.init_args.path at one."
            )
        download(self.hparams.url, self.path, self.hparams.sha256)

    def read(self) -> str:
        """The whole file, refused with the field and the fix if it cannot make both splits."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"data.path: '{self.path}' is not UTF-8 text ({error.reason} at byte {error.start}). "
                "Convert it first (e.g. `iconv -f latin1 -t utf-8 in.txt > out.txt`) or point "
                "data.init_args.path at a UTF-8 file."
            ) from error
        if not text:
            raise ValueError(f"data.path: '{self.path}' is empty. Point data.init_args.path at a text file.")
        if "\0" in text:
            raise ValueError(
                f"data.path: '{self.path}' holds NUL bytes (at character {text.index(chr(0))}), which no "
                "text has: a binary file? Point data.init_args.path at a plain text file."
            )
        if len(set(text)) < 2:
            raise ValueError(
                f"data.path: '{self.path}' holds one distinct character ({text[0]!r}), so every next "
                "character is certain and the model learns nothing (loss 0). Point data.init_args.path "
                "at a real text."
            )
        n_train = self.train_length(len(text))
        n_val = len(text) - n_train
        window = self.hparams.block_size + 1
        if min(n_train, n_val) < window:
            raise ValueError(
                f"data.path: '{self.path}' has {len(text)} characters, too few for block_size {window - 1}: "
                f"with train_fraction {self.hparams.train_fraction} the train split gets {n_train} and the "
                f"validation split {n_val}, and each needs at least one window of "
                f"block_size + 1 = {window}. Use a text of at least {self.min_length()} characters, or "
                "a smaller block_size (model.init_args.net.init_args.block_size)."
            )
        return text

    def train_length(self, n: int) -> int:
        return int(n * self.hparams.train_fraction)

    def min_length(self) -> int:
        """The shortest text whose train and validation splits each hold one whole window."""
        window = self.hparams.block_size + 1
        n = 2 * window
        while min(self.train_length(n), n - self.train_length(n)) < window:
            n += 1
        return n

    def setup(self, stage: str) -> None:
        if self.splits or stage == "predict":
            return
        if self.hparams.stream_from:
            from projkit.data.streaming import split_window

            self.stream_splits(self.hparams.stream_from, self.hparams.block_size + 1, split_window)
            rank_zero_info(f"TextDataModule: streaming from '{self.hparams.stream_from}'")
            return
        tokens = self.tokenizer.encode(self.text)
        tokens = tokens.to(torch.uint8 if self.vocab_size <= 256 else torch.int32)
        n_train = self.train_length(len(tokens))
        train, val = tokens[:n_train], tokens[n_train:]
        stride = self.hparams.block_size
        all_val = torch.arange((len(val) - 1) // stride) * stride
        spread = all_val
        if self.hparams.val_windows is not None and self.hparams.val_windows < len(all_val):
            spread = all_val[torch.linspace(0, len(all_val) - 1, self.hparams.val_windows).round().long()]
        self.splits = {
            "train": TokenWindows(train, self.hparams.block_size),
            "val": TokenWindows(val, self.hparams.block_size, spread),
            "test": TokenWindows(val, self.hparams.block_size, all_val),
        }
        rank_zero_info(
            f"TextDataModule: '{self.path}', {len(tokens):,} characters, vocabulary of {self.vocab_size}; "
            f"{len(train):,} train, {len(val):,} validation ({len(spread)} windows of {stride})"
        )

    stream_kind = "tokens"

    @property
    def stream_facts(self) -> dict[str, str]:
        return {"vocab": self.vocab}

    def stream_items(self, split: str) -> list[torch.Tensor]:
        """``optimize``: a split's tokens in pieces; read back, they are cut into windows of
        ``block_size + 1`` tokens that do not overlap (test: the validation text, as here)."""
        tokens = self.splits[split].tokens
        return list(tokens.split(1 << 16))

    def train_epoch_size(self) -> int:
        """An epoch draws as many random windows as the training text holds end to end."""
        return max(1, len(self.splits["train"].tokens) // self.hparams.block_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict_prompts, batch_size=self.hparams.batch_size, collate_fn=list)


def download(url: str, path: Path, sha256: str | None) -> None:
    """Fetch ``url`` into ``path`` through a temporary file beside it, so an interrupted or corrupt
    download never leaves a file that a later run would mistake for the real one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            digest = hashlib.sha256()
            while chunk := response.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise ValueError(f"sha256 {digest.hexdigest()} differs from data.sha256 {sha256}")
        os.replace(tmp, path)
    except Exception as error:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(
            f"Could not download {url} to '{path}' ({type(error).__name__}: {error}). Without a "
            f"network, put the text file at '{path}' yourself, or point data.init_args.path at one."
        ) from error


def _show(chars: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(repr(c) for c in chars[:limit])
    return shown + (f" and {len(chars) - limit} more" if len(chars) > limit else "")

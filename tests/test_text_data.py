"""The character data: vocabulary, windows and splits, downloads, and refusals of unusable text."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from lightning.pytorch import seed_everything
from projkit.errors import ConfigError
from projkit.testing import config

from conftest import CORPUS, TINY_SHAKESPEARE, needs_tiny_shakespeare
from proj import main
from proj.data import CharTokenizer, TextDataModule

VERSE = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"


def write_text(folder: Path, text: str = VERSE * 40, name: str = "input.txt") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def data_module(path: Path, **kwargs) -> TextDataModule:
    kwargs = {"url": None, "block_size": 8, "batch_size": 4, **kwargs}
    return TextDataModule(str(path), **kwargs)


def test_vocabulary_round_trip():
    text = "Hello, wörld!\n  ¿qué?"
    tokenizer = CharTokenizer("".join(sorted(set(text))))
    ids = tokenizer.encode(text)
    assert ids.dtype == torch.long and len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids.tolist()) == text
    with pytest.raises(ValueError, match="'#'"):
        tokenizer.encode("#")


def test_vocab_is_the_sorted_characters_of_the_file(tmp_path):
    dm = data_module(write_text(tmp_path, "banana\n" * 100))
    assert dm.vocab == "\nabn" and dm.vocab_size == 4


def test_training_windows_are_shifted_slices_of_the_train_split(tmp_path):
    text = VERSE * 40
    dm = data_module(write_text(tmp_path, text))
    dm.setup("fit")
    n_train = int(len(text) * 0.9)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y, strict=True):
        window = dm.tokenizer.decode(row_x) + dm.tokenizer.decode(row_y[-1:])
        assert window in text[:n_train]
    # An epoch is one pass's worth of windows: len(train) // block_size of them.
    assert len(dm.train_dataloader()) == -(-(n_train // 8) // 4)


def test_training_windows_follow_the_global_seed(tmp_path):
    dm = data_module(write_text(tmp_path))
    dm.setup("fit")

    def first_batch(seed: int) -> torch.Tensor:
        seed_everything(seed)
        return next(iter(dm.train_dataloader()))[0]

    assert torch.equal(first_batch(1), first_batch(1))
    assert not torch.equal(first_batch(1), first_batch(2))


def test_validation_windows_are_fixed_non_overlapping_and_spread(tmp_path):
    text = VERSE * 40
    dm = data_module(write_text(tmp_path, text), val_windows=5)
    dm.setup("fit")
    val_text = text[int(len(text) * 0.9) :]
    everything = dm.splits["test"].starts
    assert torch.equal(everything, torch.arange((len(val_text) - 1) // 8) * 8)
    starts = dm.splits["val"].starts
    assert len(starts) == 5 and starts[0] == 0 and starts[-1] == everything[-1]
    assert set(starts.tolist()) <= set(everything.tolist())
    batches = [torch.cat(b) for b in zip(*dm.val_dataloader(), strict=True)]
    again = [torch.cat(b) for b in zip(*dm.val_dataloader(), strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(batches, again, strict=True))
    x, y = batches
    for start, row_x, row_y in zip(starts.tolist(), x, y, strict=True):
        assert dm.tokenizer.decode(row_x) == val_text[start : start + 8]
        assert dm.tokenizer.decode(row_y) == val_text[start + 1 : start + 9]


def test_predict_yields_the_prompts_in_batches(tmp_path):
    dm = data_module(write_text(tmp_path), batch_size=2, predict_prompts=["Sh", "Th", "a"])
    dm.setup("predict")
    assert list(dm.predict_dataloader()) == [["Sh", "Th"], ["a"]]


@needs_tiny_shakespeare
def test_tiny_shakespeare_splits():
    dm = TextDataModule(str(TINY_SHAKESPEARE), url=None, block_size=256)
    dm.setup("fit")
    assert dm.vocab_size == 65
    assert len(dm.splits["train"].tokens) == 1_003_854 and len(dm.splits["val"].tokens) == 111_540
    assert dm.splits["train"].tokens.dtype == torch.uint8
    assert len(dm.splits["val"]) == 111_539 // 256


@pytest.mark.slow
def test_block_size_is_stated_once_on_the_network(workdir):
    args = ["--config", config("shakespeare_char_cpu.yaml"), f"--data.init_args.path={CORPUS}"]
    cli = main([*args, "--model.init_args.net.init_args.block_size=32"], run=False)
    assert cli.datamodule.hparams.block_size == cli.model.net.block_size == 32
    assert cli.model.vocab == cli.datamodule.vocab
    assert cli.model.net.transformer.wte.num_embeddings == len(set(CORPUS.read_text()))


def test_download_goes_through_a_temporary_file_and_checks_sha256(tmp_path):
    source = write_text(tmp_path, name="source.txt")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    target = tmp_path / "data" / "input.txt"
    dm = TextDataModule(str(target), url=source.as_uri(), sha256=digest, block_size=8)
    assert dm.vocab == "".join(sorted(set(VERSE)))  # asking for the vocabulary downloads
    assert target.read_text() == source.read_text()
    assert [p.name for p in target.parent.iterdir()] == ["input.txt"]


def test_download_with_the_wrong_sha256_leaves_no_file(tmp_path):
    source = write_text(tmp_path, name="source.txt")
    target = tmp_path / "data" / "input.txt"
    dm = TextDataModule(str(target), url=source.as_uri(), sha256="0" * 64, block_size=8)
    with pytest.raises(ConfigError, match=r"(?s)sha256.*put the text file at"):
        dm.prepare_data()
    assert list(target.parent.iterdir()) == []


def test_failed_download_says_where_to_put_the_file(tmp_path):
    target = tmp_path / "data" / "input.txt"
    dm = TextDataModule(str(target), url="http://127.0.0.1:9/input.txt", block_size=8)
    with pytest.raises(ConfigError, match=rf"Could not download .*put the text file at '{target}'"):
        dm.vocab  # noqa: B018
    assert list(target.parent.iterdir()) == []


def test_a_local_file_is_not_hash_checked(tmp_path):
    dm = TextDataModule(str(write_text(tmp_path)), sha256="0" * 64, block_size=8)
    assert dm.vocab_size == len(set(VERSE))


def test_missing_file_without_url_is_named(tmp_path):
    dm = data_module(tmp_path / "nope.txt")
    with pytest.raises(
        FileNotFoundError, match=r"data\.path: no text file at '.*nope\.txt'.*data\.url is null"
    ):
        dm.vocab  # noqa: B018


def test_empty_file_is_refused(tmp_path):
    dm = data_module(write_text(tmp_path, ""))
    with pytest.raises(ValueError, match=r"data\.path: '.*input\.txt' is empty"):
        dm.vocab  # noqa: B018


def test_non_utf8_file_is_named(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Señor, adiós\n".encode("latin-1") * 100)
    with pytest.raises(ValueError, match=r"data\.path: '.*latin1\.txt' is not UTF-8.*iconv"):
        data_module(path).vocab  # noqa: B018


def test_text_too_short_for_a_window_in_each_split_says_the_minimum(tmp_path):
    shortest = data_module(tmp_path / "input.txt", block_size=64).min_length()
    write_text(tmp_path, ("ab" * shortest)[:shortest])
    assert data_module(tmp_path / "input.txt", block_size=64).vocab == "ab"
    write_text(tmp_path, ("ab" * shortest)[: shortest - 1])
    with pytest.raises(
        ValueError,
        match=rf"(?s){shortest - 1} characters, too few for block_size 64.*each needs at least one "
        rf"window of block_size \+ 1 = 65.*at least {shortest} characters.*smaller block_size",
    ):
        data_module(tmp_path / "input.txt", block_size=64).vocab  # noqa: B018


@pytest.mark.parametrize(
    ("field", "value"),
    [("batch_size", 0), ("block_size", 0), ("train_fraction", 1.0), ("val_windows", 0), ("num_workers", -1)],
)
def test_bad_numbers_are_named(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"data\.{field} must"):
        data_module(tmp_path / "input.txt", **{field: value})

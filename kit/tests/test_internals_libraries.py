"""Contract tests of the seams other than Lightning's loops (test_internals.py): jsonargparse's and
argparse's parser internals, multiprocessing's and atexit's, torch's dispatch,
LightningCLI's subcommand parsers, the SLURM environment the CLI gives the Trainer, and LitData's
loader position and chunk sizes."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
from typing import Any

import pytest
import torch
from jsonargparse import ArgumentParser
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from projkit.internals import jsonargparse as jsonargparse_seam
from projkit.internals import litdata as litdata_seam
from projkit.internals import stdlib
from projkit.internals import torch as torch_seam
from projkit.reliability.preemption import without_slurm_requeue


def test_a_settings_variable_is_named_as_the_parser_reads_it(monkeypatch):
    parser = ArgumentParser(env_prefix="PL_FIT_", default_env=True)
    parser.add_argument("--trainer.max_epochs", type=int, default=1)
    action = next(a for a in stdlib.parser_actions(parser) if a.dest == "trainer.max_epochs")
    name = jsonargparse_seam.env_var_name(parser, action)
    assert name == "PL_FIT__TRAINER__MAX_EPOCHS"
    monkeypatch.setenv(name, "7")
    assert parser.parse_args([]).trainer.max_epochs == 7


def test_a_subcommands_help_line_is_set_where_help_shows_it():
    parser = ArgumentParser(prog="tool")
    subcommands = parser.add_subcommands()
    subcommands.add_subcommand("fit", ArgumentParser(), help="Lightning's line")
    action = jsonargparse_seam.subcommands_action(parser)
    assert set(action.choices) == {"fit"}
    for choice in stdlib.choice_help_actions(action):
        choice.help = "train a model"
    assert "train a model" in parser.format_help() and "Lightning's line" not in parser.format_help()


def test_a_forked_child_becomes_a_main_process():
    main = multiprocessing.current_process()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def child() -> None:
        stdlib.become_main_process(main)
        queue.put((multiprocessing.current_process() is main, multiprocessing.parent_process() is None))

    process = context.Process(target=child)
    process.start()
    process.join(30)
    assert queue.get(timeout=5) == (True, True)


def test_exit_functions_run_when_asked(tmp_path):
    """In a forked child, as the kit uses it: this process's own exit functions must not run here."""
    marker = tmp_path / "ran"
    child = os.fork()
    if child == 0:
        atexit._clear()  # the test process's own, which must not run in its copy
        atexit.register(marker.write_text, "yes")
        stdlib.run_exit_functions()
        os._exit(0)
    os.waitpid(child, 0)
    assert marker.read_text() == "yes"


class Ops(torch_seam.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


def test_the_private_operations_are_what_reads_of_device_values_dispatch_to():
    values = torch.tensor([1.0, 2.0, 2.0])
    with Ops() as ops:
        values.sum().item()
    assert torch_seam.LOCAL_SCALAR_DENSE in ops.seen
    with Ops() as ops:
        torch.unique(values)
    assert ops.seen & torch_seam.UNIQUE_OPS
    # What ``index_put_`` runs below dispatch on some devices: a boolean mask's assignment.
    torch_seam.INDEX_PUT_IMPL(values, [values > 1], torch.tensor([5.0, 6.0]))
    assert values.tolist() == [1.0, 5.0, 6.0]
    assert torch_seam.tree_leaves({"a": [values, (1, values)]}) == [values, 1, values]


def test_the_multi_tensor_operations_norm_and_multiply_each_tensor_of_a_list():
    grads = [
        torch.tensor([3.0, 4.0]),
        torch.tensor([[float("nan")]]),
        torch.tensor([-2.0], dtype=torch.float64),
    ]
    norms = torch_seam.foreach_norm(grads)
    assert norms[0].item() == 5.0 and norms[1].isnan() and norms[2].item() == 2.0
    bits = [torch.tensor([7, -1], dtype=torch.int32), torch.tensor([5], dtype=torch.int16)]
    torch_seam.foreach_mul_(bits, torch.tensor(0, dtype=torch.int8))
    assert [b.tolist() for b in bits] == [[0, 0], [0]] and bits[1].dtype == torch.int16


def test_lightning_cli_keeps_each_subcommands_parser(tmp_path):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from projkit.internals.lightning import subcommand_parser

    cli = LightningCLI(
        BoringModel,
        BoringDataModule,
        args=["fit", "--trainer.fast_dev_run=1", f"--trainer.default_root_dir={tmp_path}"],
    )
    parser = subcommand_parser(cli, "fit")
    assert any(action.dest == "trainer.max_epochs" for action in stdlib.parser_actions(parser))


SLURM = {
    "SLURM_NTASKS": "1",
    "SLURM_JOB_NAME": "train",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
}


def test_under_slurm_the_trainer_gets_slurms_environment_without_its_requeue(monkeypatch):
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    (environment,) = without_slurm_requeue(None)
    assert isinstance(environment, SLURMEnvironment) and not environment.auto_requeue
    before = signal.getsignal(signal.SIGUSR1)
    trainer = Trainer(accelerator="cpu", logger=False, plugins=[environment])
    trainer._signal_connector.register_signal_handlers()
    try:
        assert signal.getsignal(signal.SIGUSR1) == before  # no requeue handler
    finally:
        trainer._signal_connector.teardown()
    given = SLURMEnvironment()
    assert without_slurm_requeue([given, "bf16-mixed"]) == [given, "bf16-mixed"] and not given.auto_requeue


def test_outside_slurm_no_environment_is_added(monkeypatch):
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    assert without_slurm_requeue(None) == []


def test_lightning_cli_saves_the_class_it_built_under_the_class_path_key(tmp_path):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringDataModule

    from projkit.internals.lightning import CLASS_PATH_KEY

    cli = LightningCLI(
        SavingModel,
        BoringDataModule,
        subclass_mode_model=True,
        args=[
            "fit",
            f"--model={__name__}.SavingModel",
            "--trainer.fast_dev_run=1",
            f"--trainer.default_root_dir={tmp_path}",
        ],
    )
    assert cli.model.hparams[CLASS_PATH_KEY] == f"{__name__}.SavingModel"


class SavingModel(BoringModel):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.fixture
def litdata_chunks(tmp_path) -> str:
    """24 numbers written with LitData's Cache, 4 to a chunk: a dataset its loader shuffles."""
    from litdata.streaming import Cache

    cache = Cache(str(tmp_path / "chunks"), chunk_size=4)
    for index in range(24):
        cache[index] = index
    cache.done()
    cache.merge()
    return str(tmp_path / "chunks")


def litdata_loader(chunks: str) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    return StreamingDataLoader(StreamingDataset(chunks, shuffle=True, seed=3), batch_size=4)


def read(batches: Any) -> list[list[int]]:
    return [batch.tolist() for batch in batches]


def test_a_litdata_loader_replays_a_restored_position_until_the_restore_ends(litdata_chunks):
    first = litdata_loader(litdata_chunks)
    batches = iter(first)
    start = read([next(batches), next(batches)])
    state, rest = first.state_dict(), read(batches)
    epoch_two = read(first)
    numbers = [number for batch in start + rest for number in batch]
    assert sorted(numbers) == list(range(24)) and start + rest != epoch_two, "another order each epoch"
    assert sorted(number for batch in epoch_two for number in batch) == list(range(24))
    resumed = litdata_loader(litdata_chunks)
    resumed.load_state_dict(state)
    assert litdata_seam.restoring(resumed)
    next(iter(resumed))  # an epoch left early keeps the position restored
    assert litdata_seam.restoring(resumed) and read(resumed) == rest
    assert not litdata_seam.restoring(resumed), "an epoch read to its end ends the restore"
    cut_short = litdata_loader(litdata_chunks)
    cut_short.load_state_dict(state)
    next(iter(cut_short))
    litdata_seam.end_restore(cut_short)
    assert not litdata_seam.restoring(cut_short) and read(cut_short) == epoch_two


def test_a_litdata_loader_starts_after_the_epoch_it_is_given(litdata_chunks):
    first = litdata_loader(litdata_chunks)
    read(first)
    epoch_two = read(first)
    after_one = litdata_loader(litdata_chunks)
    litdata_seam.resume_epoch_end(after_one, 1)
    assert read(after_one) == epoch_two


@pytest.mark.parametrize(
    ("text", "size"),
    [("64MB", 64_000_000), ("1.5g", 1_500_000_000), (" 2 Kb ", 2000), ("-5MB", -5_000_000), ("1e3b", 1000),
     ("abc", None), ("64XB", None), ("1000", None), ("infmb", None)],
)  # fmt: skip
def test_a_chunk_size_is_read_as_litdatas_writer_reads_it(text, size, tmp_path):
    from litdata.streaming.writer import BinaryWriter

    assert litdata_seam.bytes_of(text) == size
    if size is not None:
        assert BinaryWriter(str(tmp_path), chunk_bytes=text).get_config()["chunk_bytes"] == size

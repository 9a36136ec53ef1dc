"""The checkpoint-state fuzzer: a checkpoint of plain values whose callback, loop, data or RNG state
holds garbage (paths up with ``..``, absolute, through links, in unicode, with control characters,
too long for the file system; numbers of the wrong kind or size) is loaded as Lightning loads it on
``fit --ckpt_path``. Each case must either be refused in one line naming ``--ckpt_path``, or load
with every file a checkpoint callback names inside the run's checkpoints/ (the k-th best among
the best, which Lightning deletes next) and callbacks that run on; never a traceback.

Most cases run the loading steps on a Trainer built once (a millisecond each); a few run whole
commands through ``main`` (a resumed fit that then validates better, a test, a predict) and check
that nothing outside the run changed. Seeded (``derandomize``); ``PROJ_FUZZ_EXAMPLES`` sets the
number of cases (``make fuzz`` runs many more).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from conftest import main
from crafted import (
    BEST,
    CHECKPOINTS,
    LAST,
    WORST,
    aimed_at,
    base_run,
    craft,
    everything_but_the_run,
    links,
    working_copy,
)
from projkit.checks.checkpoint import check_counters
from projkit.errors import ConfigError
from projkit.reliability.contained import PATHS, ContainedState
from projkit.reliability.resume import restore_rng_states, valid_row
from projkit.testing import TINY_FIT, config

# A size that fits the kit's suite (a few seconds); `make fuzz` sets thousands.
EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "100"))
WHOLE_COMMANDS = max(2, EXAMPLES // 100)
CK = str(CHECKPOINTS)


def paths(work: str) -> st.SearchStrategy[str]:
    """Paths a checkpoint's state might name: aimed outside the run in each way, or odd in form."""
    aimed = [
        f"{CK}/../../../../victim/folder",
        f"{CK}/../../../../victim/folder/model.ckpt",
        f"{CK}/linkdir/model.ckpt",
        f"{CK}/link.ckpt",
        f"{CK}/linkdir",
        f"{work}/{CK}/../../../../../outside/folder",
        f"{work}/../outside/folder/model.ckpt",
        "/etc/passwd",
        "/",
        ".",
        "..",
        "",
        CK,
        f"{CK}/.",
        f"{CK}/last.ckpt",
        f"{work}/{CK}/last.ckpt",
        f"{CK}/../checkpoints/last.ckpt",
        "memory://x.ckpt",
        "file:///etc/passwd.ckpt",
        f"{CK}/\x00.ckpt",
    ]
    parts = st.lists(
        st.sampled_from(["..", ".", "", "a", "ü", "\u200b", "\n", "\t", "x" * 255, "x" * 300, "linkdir"]),
        max_size=8,
    )
    built = st.builds(
        lambda start, middle, end: start + "/".join(middle) + end,
        st.sampled_from([f"{CK}/", f"{work}/{CK}/", "", "/"]),
        parts,
        st.sampled_from([".ckpt", "", "/", "/model.ckpt"]),
    )
    text = st.text(max_size=40).map(lambda t: f"{CK}/{t}.ckpt")
    huge = st.integers(4000, 70000).map(lambda n: f"{CK}/{'a' * n}.ckpt")
    return st.sampled_from(aimed) | built | text | huge


GARBAGE = st.sampled_from(
    [None, -1, 0, 7, 2**70, -(2**70), float("nan"), float("inf"), True, "", "abc", "1.0", [], [1], {},
     {"a": 1}, torch.tensor(1.0), torch.tensor([1.0, 2.0]), torch.tensor(float("nan")), torch.tensor(3)]
)  # fmt: skip


def targets(checkpoint: dict) -> st.SearchStrategy[tuple]:
    """A key path of the state a resume acts on, each group as likely: a checkpoint callback's field
    (or its whole state aimed at one path), another callback's, a loop counter, the step, epoch and
    Lightning's version, the data module's position, the RNG states."""
    states = checkpoint["callbacks"]
    checkpoints = [("callbacks", key, name) for key in (BEST, LAST) for name in [*states[key], "*aimed*"]]
    others = [("callbacks", key, name) for key in states for name in states[key] if key not in (BEST, LAST)]
    others += [("callbacks",), *(("callbacks", key) for key in states)]
    loops = [("loops",), ("loops", "fit_loop")]

    def leaves(tree: object, at: tuple) -> None:
        if isinstance(tree, dict):
            for name, value in tree.items():
                leaves(value, (*at, name))
        loops.append(at)

    leaves(checkpoint["loops"]["fit_loop"], ("loops", "fit_loop"))
    counters = [("global_step",), ("epoch",), ("pytorch-lightning_version",), ("pending_row",)]
    data = [("Blobs",), ("Blobs", "train_order")]
    data += [("Blobs", "train_order", name) for name in ("epoch", "batches", "epoch_done", "world_size")]
    rng = [("rng_states",), ("rng_states", 0), ("rng_states", 0, "torch"), ("rng_states", 0, "numpy")]
    groups = [checkpoints, checkpoints, others, loops, counters, data, rng]
    return st.sampled_from(groups).flatmap(st.sampled_from)


def changed(checkpoint: dict, at: tuple, value: object) -> dict:
    """``checkpoint`` with ``value`` at ``at`` (``*aimed*``: the whole state aimed at ``value``)."""
    checkpoint = copy.deepcopy(checkpoint)
    holder = checkpoint
    for key in at[:-1]:
        holder = holder[key]
    if at[-1] == "*aimed*":
        holder.update(aimed_at(value) if isinstance(value, str) else {"best_k_models": {str(value): WORST}})
    else:
        holder[at[-1]] = value
    return checkpoint


def inside_the_run(path: object, work: Path) -> bool:
    if path in ("", None):
        return True
    resolved = Path(path).resolve()
    return str(path).endswith(".ckpt") and (work / CHECKPOINTS).resolve() in resolved.parents


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return base_run(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def loaded(base: Path, tmp_path_factory: pytest.TempPathFactory):
    """The Trainer of a fit, built and not run, beside a copy of a finished run whose last checkpoint
    it is to resume; that checkpoint."""
    root = tmp_path_factory.mktemp("state")
    work = working_copy(base, root)
    links(work)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        cli = main(["--config", config("classify.yaml"), *TINY_FIT], run=False)
    trainer = cli.trainer
    trainer.state.fn = TrainerFn.FITTING
    for callback in trainer.checkpoint_callbacks:
        callback.dirpath = CK  # as Lightning sets it when the resumed fit starts
    checkpoint = torch.load(work / CHECKPOINTS / "last.ckpt", weights_only=True)
    return work, cli, checkpoint


def load_as_lightning_does(checkpoint: dict, cli) -> None:
    """What `fit --ckpt_path` does with a checkpoint, in Lightning's order: the CLI's checks, the
    data module's state, every callback's ``on_load_checkpoint`` then ``load_state_dict``, the loop."""
    trainer = cli.trainer
    check_counters(checkpoint, "--ckpt_path", "last.ckpt")
    cli.datamodule.load_state_dict(checkpoint["Blobs"]) if "Blobs" in checkpoint else None
    ContainedState().on_load_checkpoint(trainer, cli.model, checkpoint)
    for callback in trainer.callbacks:
        state = checkpoint["callbacks"].get(callback.state_key)
        if state:
            callback.load_state_dict(copy.deepcopy(state))
    trainer.fit_loop.load_state_dict(checkpoint["loops"]["fit_loop"])
    restore_rng_states(checkpoint["rng_states"], 0)
    valid_row(checkpoint.get("pending_row"))  # what a resume logs, only when it is a row


def runs_on(trainer, work: Path) -> None:
    """What the resumed run does next with the state: compare a score, stop early or not, delete the
    k-th best; every file named is the run's own."""
    current = torch.tensor(0.5)
    assert 0 <= trainer.global_step < 2**63 and 0 <= trainer.current_epoch < 2**63
    for callback in trainer.callbacks:
        if isinstance(callback, EarlyStopping):
            callback._evaluate_stopping_criteria(current)
        if not isinstance(callback, ModelCheckpoint):
            continue
        named = [*callback.best_k_models, *(getattr(callback, name) for name in PATHS)]
        assert all(inside_the_run(path, work) for path in named), named
        if callback.best_k_models:
            assert callback.kth_best_model_path in callback.best_k_models
            callback.check_monitor_top_k(trainer, current)


@pytest.mark.slow
def test_fuzz_checkpoint_state(loaded, monkeypatch: pytest.MonkeyPatch):
    work, cli, checkpoint = loaded
    monkeypatch.chdir(work)
    fresh = [copy.deepcopy(callback) for callback in cli.trainer.callbacks]
    fresh_loop, rng = copy.deepcopy(cli.trainer.fit_loop.state_dict()), torch.get_rng_state()
    cases, refused = [], []

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(at=targets(checkpoint), value=paths(str(work)) | GARBAGE)
    def case(at: tuple, value: object) -> None:
        cases.append(at)
        cli.trainer.callbacks = [copy.deepcopy(callback) for callback in fresh]
        cli.trainer.fit_loop.load_state_dict(fresh_loop)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_as_lightning_does(changed(checkpoint, at, value), cli)
        except ConfigError as error:
            assert str(error).startswith("--ckpt_path") and "\n" not in str(error), error
            refused.append(at)
            return
        runs_on(cli.trainer, work)

    case()
    torch.set_rng_state(rng)
    print(f"{len(cases)} cases over {len(set(cases))} fields, {len(refused)} refused")
    assert len(cases) >= min(EXAMPLES, 400) * 0.8 and 0 < len(refused) < len(cases)


@pytest.mark.slow
def test_fuzz_checkpoint_state_whole_commands(base: Path, capsys):
    """Whole commands on crafted checkpoints: exit 0 or 2 in one line, nothing outside the run changed."""
    seen = []

    @settings(max_examples=WHOLE_COMMANDS, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(command=st.sampled_from(["fit", "test", "predict"]), path=paths("{work}"),
           extra=targets(torch.load(base / CHECKPOINTS / "last.ckpt", weights_only=True)),
           value=GARBAGE)  # fmt: skip
    def case(command: str, path: str, extra: tuple, value: object) -> None:
        root = Path(tempfile.mkdtemp(dir=base.parent))
        work = working_copy(base, root)
        links(work)
        file = work / CHECKPOINTS / "last.ckpt"
        aimed = aimed_at(path.replace("{work}", str(work)))
        craft(file, {("callbacks", BEST, k): v for k, v in aimed.items()})
        torch.save(changed(torch.load(file, weights_only=True), extra, value), file)
        before = everything_but_the_run(root)
        args = [command, "--config", config("classify.yaml"), *TINY_FIT, f"--ckpt_path={file}"]
        args += ["--trainer.max_epochs=2", "--test_after_fit=false"] if command == "fit" else []
        previous = os.getcwd()
        os.chdir(work)
        try:
            main(args)
            code = 0
        except SystemExit as exit:
            code = exit.code
        finally:
            os.chdir(previous)
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, err[-3000:]
        assert code == 0 or len([line for line in err.splitlines() if line.startswith("error: ")]) == 1
        assert everything_but_the_run(root) == before, f"{command} on {path!r} and {extra}={value!r}"
        seen.append((command, code))
        shutil.rmtree(root)

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PROJ_DEBUG")
        case()
    print(f"{len(seen)} whole commands: {seen}")
    assert len(seen) >= min(WHOLE_COMMANDS, 3)

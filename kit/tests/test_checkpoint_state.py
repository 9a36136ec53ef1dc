"""A checkpoint cannot make a command delete or write outside its run: every file its callback state
names is checked before Lightning acts on it, and one outside the run's checkpoints/ is dropped with
a warning. Checkpoints of plain strings load with weights only, so this is the way a crafted one
would act: Lightning deletes the "k-th best" file its state names at the first better validation,
recursively, after a parent check that does not resolve ``..``."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from conftest import main
from crafted import (
    BEST,
    CHECKPOINTS,
    LAST,
    aimed_at,
    base_run,
    craft,
    everything_but_the_run,
    links,
    working_copy,
)
from projkit.testing import TINY_FIT, config

QUIET = ("--trainer.enable_progress_bar=false",)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return base_run(tmp_path_factory.mktemp("base"))


@pytest.fixture
def work(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    work = working_copy(base, tmp_path)
    links(work)
    monkeypatch.chdir(work)
    return work


def aims(work: Path) -> dict[str, str]:
    """Each way a path in a checkpoint reaches outside the run: up with ``..``, through a link inside
    checkpoints/, and an absolute path that climbs out."""
    return {
        "dotdot": f"{CHECKPOINTS}/../../../../victim/folder",
        "link": f"{CHECKPOINTS}/linkdir/model.ckpt",
        "absolute": f"{work / CHECKPOINTS}/../../../../../outside/folder",
    }


def run(args: list[str]) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = main([*args, *QUIET])
    return cli, [str(w.message) for w in caught]


@pytest.mark.slow
def test_a_resume_then_a_better_validation_deletes_nothing_outside_the_run(work: Path):
    """The monitoring callback aimed up with ``..``, the last-checkpoint one through a link inside
    checkpoints/: one resume, both dropped (the fuzzer tries every other field and aim)."""
    targets = aims(work)
    changes = {("callbacks", BEST, k): v for k, v in aimed_at(targets["dotdot"]).items()}
    changes |= {("callbacks", LAST, k): v for k, v in aimed_at(targets["link"]).items()}
    craft(work / CHECKPOINTS / "last.ckpt", changes)
    before = everything_but_the_run(work.parent)
    cli, said = run(["fit", "--config", config("classify.yaml"), *TINY_FIT, "--trainer.max_epochs=2",
                     "--test_after_fit=false", "--ckpt_path=last"])  # fmt: skip
    assert cli.trainer.global_step == 4, "the resume trained its second epoch"
    assert everything_but_the_run(work.parent) == before
    dropped = [line for line in said if "outside runs/classify/version_0/checkpoints: dropped" in line]
    assert len(dropped) == 2 and targets["dotdot"][:60] in dropped[0] + dropped[1], said
    best = cli.trainer.checkpoint_callback.best_model_path
    assert Path(best).resolve().parent == (work / CHECKPOINTS).resolve(), "the best is the run's own"


@pytest.mark.slow
def test_evaluating_a_crafted_checkpoint_writes_nothing_outside_the_run(work: Path):
    targets = aims(work)
    changes = {("callbacks", BEST, k): v for k, v in aimed_at(targets["dotdot"]).items()}
    changes |= {("callbacks", LAST, k): v for k, v in aimed_at(targets["link"]).items()}
    craft(work / CHECKPOINTS / "last.ckpt", changes)
    before = everything_but_the_run(work.parent)
    for command in ("test", "predict"):
        run([command, "--config", config("classify.yaml"), *TINY_FIT, f"--ckpt_path={CHECKPOINTS}/last.ckpt"])
    assert everything_but_the_run(work.parent) == before

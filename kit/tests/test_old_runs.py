"""Runs and checkpoints from before the kit's split (projkit 1.0.0), when the template's own package
held the machinery: their config.yaml and their checkpoints' hyperparameters name the kit's classes
under that package (``<package>.optim.WarmupCosineLR``). ``fit --ckpt_path``, ``test``, ``predict`` and
``export`` read them as the kit's, with one warning naming each old path and the new one; the owner's
own classes are left as they are.

A run of tinyproj's, fitted by today's code, is made old by writing its class paths back as the
template wrote them (``OLD_PATHS``); a fuzzer gives every YAML the CLI loads old and other class paths.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jsonargparse import get_loader

from conftest import main, seeded
from projkit.cli import ProjectCLI  # also installs the YAML loader the CLI reads configs with
from projkit.optim import WarmupCosineLR
from projkit.strict_yaml import without_empty_arguments
from projkit.testing import TINY_FIT, config
from tinyproj.models import Classifier

QUIET = ("--trainer.enable_progress_bar=false",)
RUN = Path("runs", "classify", "version_0")
# The kit's classes in a tinyproj run, as the template named them before the split under its package
# (its configs/defaults.yaml and experiment configs at 21f9c14, the commit before kit/ was added, and
# the config.yaml and hyperparameters its CLI wrote: jsonargparse's shortest import path of each).
OLD_PATHS = {
    "projkit.optim.WarmupCosineLR": "tinyproj.optim.WarmupCosineLR",
    "projkit.reliability.LastCheckpoint": "tinyproj.reliability.LastCheckpoint",
    "projkit.callbacks.TrainingThroughput": "tinyproj.callbacks.TrainingThroughput",
    "projkit.reliability.ExactResume": "tinyproj.reliability.ExactResume",
    "projkit.reliability.Preemption": "tinyproj.reliability.Preemption",
    "projkit.reliability.StopOnDivergence": "tinyproj.reliability.StopOnDivergence",
    "projkit.reliability.AtomicCheckpointIO": "tinyproj.reliability.AtomicCheckpointIO",
}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding runs/ of a two-step classify run, checkpoints and config.yaml as today's
    code writes them."""
    folder = tmp_path_factory.mktemp("old_runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        main(["fit", "--config", config("classify.yaml"), *TINY_FIT, "--test_after_fit=false"])
    return folder


def old_paths(tree: object) -> object:
    """``tree`` with the kit's class paths as the template wrote them."""
    if isinstance(tree, list):
        return [old_paths(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    tree = {key: old_paths(value) for key, value in tree.items()}
    if tree.get("class_path") in OLD_PATHS:
        tree["class_path"] = OLD_PATHS[tree["class_path"]]
    return tree


def old_run(fitted: Path, here: Path) -> Path:
    """The fitted run copied into ``here`` as the template before the split wrote it: its
    config.yaml and its checkpoints' hyperparameters name the kit's classes under tinyproj."""
    shutil.copytree(fitted / "runs", here / "runs")
    saved = here / RUN / "config.yaml"
    text = saved.read_text()
    for new, old in OLD_PATHS.items():
        text = text.replace(f"class_path: {new}\n", f"class_path: {old}\n")
    saved.write_text(text)
    assert "projkit" not in text, "precondition: the run's config names no class of today's kit"
    for path in (here / RUN / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=True)
        checkpoint["hyper_parameters"] = old_paths(checkpoint["hyper_parameters"])
        torch.save(checkpoint, path)
    return here / RUN


def run_warned(args: list[str]) -> tuple[ProjectCLI, list[str]]:
    """The command ``args`` run in this process, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = main([*args, *QUIET])
    return cli, [str(w.message) for w in caught]


def of_old_paths(said: list[str]) -> list[str]:
    return [message for message in said if "before the kit's split" in message]


@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["test", "predict", "export"])
def test_a_checkpoint_from_before_the_split_is_evaluated_with_one_warning(fitted, workdir, subcommand):
    run = old_run(fitted, workdir)
    args = [subcommand, "--config", config("classify.yaml"), f"--ckpt_path={run}/checkpoints/last.ckpt"]
    args += {
        "test": ["--trainer.limit_test_batches=1"],
        "predict": ["--trainer.limit_predict_batches=1"],
    }.get(subcommand, [])
    cli, said = run_warned([*args, *(["--formats=pt2"] if subcommand == "export" else [])])
    assert len(of_old_paths(said)) == 1, said
    assert "tinyproj.optim.WarmupCosineLR is projkit.optim.WarmupCosineLR" in of_old_paths(said)[0]
    assert "projkit 2.0" in of_old_paths(said)[0]
    assert cli.model.hparams["scheduler"]["class_path"] == "projkit.optim.WarmupCosineLR"


@pytest.mark.slow
def test_a_run_from_before_the_split_resumes_as_it_was_with_one_warning(fitted, workdir):
    """Resumed from its config.yaml, the run trains on with the same classes; the owner's own are
    read as they are, and the comparison with the settings the run began with finds only what the
    command changed."""
    run = old_run(fitted, workdir)
    resume = ["fit", "--config", f"{run}/config.yaml", "--ckpt_path=last", "--trainer.max_epochs=2"]
    cli, said = run_warned(resume)
    (warned,) = of_old_paths(said)
    assert all(f"{old} is {new}" in warned for new, old in OLD_PATHS.items()), warned
    assert not re.search(r"tinyproj\.(models|nets|data)\.", warned), "the owner's classes are as they were"
    assert cli.trainer.global_step == 4, "trained on from the checkpoint's step 2"
    (other_settings,) = [message for message in said if "other settings" in message]
    assert "trainer.max_epochs=2 (was 1)" in other_settings
    assert not re.search(r"\w+=projkit\.", other_settings), other_settings
    written = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert written["scheduler"]["class_path"] == "projkit.optim.WarmupCosineLR"


@pytest.mark.slow
def test_a_checkpoint_from_before_the_split_loads_in_python_with_one_warning(fitted, workdir):
    """``load_from_checkpoint``, as a notebook loads a trained model, builds what the CLI builds."""
    run = old_run(fitted, workdir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Classifier.load_from_checkpoint(run / "checkpoints" / "last.ckpt")
    (warned,) = of_old_paths([str(w.message) for w in caught])
    assert "tinyproj.optim.WarmupCosineLR is projkit.optim.WarmupCosineLR" in warned
    assert isinstance(model.scheduler(torch.optim.SGD(model.parameters(), lr=1.0)), WarmupCosineLR)


EXAMPLES = int(os.environ.get("PROJ_FUZZ_EXAMPLES", "500")) // 10
SETTINGS = seeded(EXAMPLES)
# Moved classes under their old paths (by package and by module), and paths that stay as given: the
# owner's classes, a library's, today's kit's, an old module alone, a private or unknown name, a
# moved class the owner's package names itself, a library's class a kit module imports, another
# package (a run from before `make rename`), malformed paths.
MOVED = {
    "tinyproj.optim.WarmupCosineLR": "projkit.optim.WarmupCosineLR",
    "tinyproj.callbacks.tuning.BatchSizeFinder": "projkit.callbacks.tuning.BatchSizeFinder",
    "tinyproj.reliability.resume.ExactResume": "projkit.reliability.resume.ExactResume",
    "tinyproj.reliability.Preemption": "projkit.reliability.Preemption",
    "tinyproj.models.task.TaskModule": "projkit.task.TaskModule",
    "tinyproj.nets.PixelInput": "projkit.deploy.PixelInput",
}
KEPT = [
    "tinyproj.models.Classifier", "tinyproj.nets.MLP", "torch.optim.AdamW", "projkit.optim.WarmupCosineLR",
    "tinyproj.optim", "tinyproj.optim._Hidden", "tinyproj.optim.NoSuchClass", "tinyproj.models.TaskModule",
    "tinyproj.models.task.LightningModule", "other.optim.WarmupCosineLR", "tinyproj..optim.WarmupCosineLR",
    "tinyproj.optim.WarmupCosineLR.x", "",
]  # fmt: skip
CLASS_PATHS = st.sampled_from([*MOVED, *KEPT])
KEYS = st.sampled_from(["init_args", "net", "callbacks", "scheduler", "class_path"])
TREES = st.recursive(
    st.one_of(CLASS_PATHS, st.integers(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.fixed_dictionaries({"class_path": CLASS_PATHS}, optional={"init_args": inner}),
        st.dictionaries(KEYS, inner, max_size=3),
    ),
    max_leaves=12,
)


def as_the_kit_names_them(tree: object) -> object:
    """``tree`` with each class path of ``MOVED`` by its new path."""
    if isinstance(tree, list):
        return [as_the_kit_names_them(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    path = tree.get("class_path")
    moved = {"class_path": MOVED[path]} if isinstance(path, str) and path in MOVED else {}
    return {**{key: as_the_kit_names_them(value) for key, value in tree.items()}, **moved}


@pytest.mark.slow
@SETTINGS
@given(tree=TREES)
def test_every_yaml_the_cli_loads_names_moved_classes_by_the_kits_paths_and_no_other_changes(tree):
    """Any YAML the CLI loads (a config file, a run's config.yaml, a flag's value) holding class paths
    at any depth: each old path of a moved class becomes the kit's, and nothing else changes (but
    for the empty ``init_args:`` that reads as no arguments)."""
    assert get_loader("yaml")(yaml.safe_dump(tree)) == without_empty_arguments(as_the_kit_names_them(tree))

"""``--ckpt_path``: which checkpoint a command resumes or evaluates, found over the experiment's
runs for ``last``, ``best`` and ``auto``, checked before anything is built, and the run directory
the command then writes into (that checkpoint's own)."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from projkit.checks.checkpoint import check_ckpt_path, load_checkpoint
from projkit.errors import ConfigError
from projkit.rundir.claim import JOB_FILE, job_id
from projkit.rundir.naming import class_of, experiment_dir, logger_kind, same_experiment, version_of

# The keyword this command's --ckpt_path gave (`last`, `best`) and the file it found: `export` names
# its folder by the keyword, so the folder a page or script names for `best` stays the same.
_named: ContextVar[tuple[str, Path] | None] = ContextVar("ckpt_keyword", default=None)


def keyword_of(path: str | Path) -> str | None:
    """``last`` or ``best`` where this command's ``--ckpt_path`` named ``path`` by that keyword;
    None where it gave the path itself (or named another file)."""
    named = _named.get()
    return named[0] if named is not None and named[1] == Path(path) else None


def resolve_checkpoint(config, subcommand: str, parser: LightningArgumentParser) -> dict | None:
    """Turn ``--ckpt_path`` into the file the command loads, check it, and point the logger at that
    checkpoint's own run directory (for W&B and MLflow: the same run, whose id is the folder's name).
    Returns the checkpoint as read for the checks (tensors memory-mapped), None when none is.

    ``last`` is the experiment's newest readable checkpoint over all its runs. ``auto`` (``fit``, for
    job scripts that requeue) is inside a batch job the newest checkpoint of the run this job started
    (a requeued job resumes its own run, never an earlier job's), outside one the same as ``last``,
    and either way a fresh start when there is none. ``best`` is the
    best checkpoint of that newest run. Lightning's own ``last`` and ``best`` look only in the new
    run's empty folder and then quietly fall back to untrained weights. ``validate``, ``test`` and
    ``predict`` never evaluate untrained weights unless ``--allow_untrained`` says so.
    """
    ckpt_path = config.get("ckpt_path")
    evaluating = subcommand != "fit"
    _named.set(None)
    if "ckpt_path" not in config:  # a command that reads no checkpoint (optimize)
        return None
    if ckpt_path is None:
        if evaluating and not config.get("allow_untrained") and not config.model.init_args.get("init_from"):
            parser.error(
                f"`{subcommand}` without --ckpt_path would use untrained weights. Pass --ckpt_path last "
                "(the experiment's newest checkpoint), --ckpt_path best (the best of its newest run) or "
                "the path of a .ckpt file; to evaluate untrained weights on purpose, --allow_untrained=true."
            )
        return None
    if ckpt_path in ("hpc", "registry") or str(ckpt_path).startswith("registry:"):
        return None
    root = experiment_dir(config)
    checkpoint = None
    if ckpt_path in ("last", "auto", "best"):
        found = search(config, ckpt_path, root, evaluating, parser)
        if found is None:  # `fit --ckpt_path auto` with nothing to resume: a fresh start
            config.ckpt_path = None
            return None
        path, checkpoint = found
        if ckpt_path in ("last", "best"):
            _named.set((ckpt_path, path))
        config.ckpt_path = ckpt_path = str(path)
    # The newest checkpoint was read while searching: checked as read, not read again.
    checkpoint = check_ckpt_path(ckpt_path, parser, config, checkpoint)
    if not evaluating and "optimizer_states" not in checkpoint:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds weights only, no optimizer state, so `fit` cannot resume "
            "from it. To start training from these weights, use model.init_args.init_from where the "
            "model has it; to evaluate them, use `test` or `validate`."
        )
    if root is not None and Path(ckpt_path).parent.name == "checkpoints":
        write_into_its_run(config, Path(ckpt_path).resolve().parent.parent, root, checkpoint, evaluating)
    return checkpoint


def search(
    config, ckpt_path: str, root: Path | None, evaluating: bool, parser: LightningArgumentParser
) -> tuple[Path, dict | None] | None:
    """The file ``last``, ``best`` or ``auto`` names, with the checkpoint when it was read on the way
    (None when it was not); None for an ``auto`` that finds nothing to resume."""
    if root is None:
        parser.error(
            f"--ckpt_path {ckpt_path}: the config has no logger, so there is no "
            "runs/<experiment>/ folder to look in. Pass the path of a .ckpt file instead."
        )
    job = job_id() if ckpt_path == "auto" else None
    found = newest_checkpoint(config, root, resumable=not evaluating, job=job)
    if found is None and ckpt_path == "auto" and not evaluating:
        if job is not None:
            rank_zero_info(f"--ckpt_path auto: job {job} has no run under {root} yet; it starts a new one.")
        return None
    if found is None:
        parser.error(
            f"--ckpt_path {ckpt_path}: no readable checkpoint under {root}/*/checkpoints/. "
            + (
                "Run `fit` first, or pass the path of a .ckpt file."
                if evaluating
                else "Drop --ckpt_path to train from scratch (or use --ckpt_path auto: resume if "
                "possible, else start), or pass the path of a .ckpt file to resume from."
            )
        )
    path, checkpoint = found
    if ckpt_path != "best":
        return path, checkpoint
    best = best_of_run(path, checkpoint)
    if best is None:
        parser.error(
            f"--ckpt_path best: the newest run, {path.parent.parent}, recorded no best checkpoint "
            "(no monitored ModelCheckpoint saved one). Use --ckpt_path last, or a .ckpt path."
        )
    return best, None


def write_into_its_run(config, run: Path, root: Path, checkpoint: dict, evaluating: bool) -> None:
    """Point the configured logger at ``run``, the checkpoint's run directory, when it is one of the
    experiment's (``root``'s) runs: its version, or for MLflow its run id."""
    kind = logger_kind(config)
    version = version_of(run, root, numbered=kind is None)
    if version is None:
        return
    logger = config.trainer.logger
    if kind == "mlflow":  # MLFlowLogger takes the run's id, and no version
        logger.init_args.run_id = version
    else:
        logger.init_args.version = version
    if not evaluating and issubclass(class_of(logger) or object, TensorBoardLogger):
        # TensorBoard's own remedy for a resumed run: its reader drops the events from this step
        # on that the killed run wrote, which the resumed one writes again.
        logger.dict_kwargs = {**(logger.get("dict_kwargs") or {}), "purge_step": checkpoint["global_step"]}


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path`` (``load_checkpoint``), or None with a warning when it cannot be read
    (a truncated save, code in it, something that is no checkpoint): a search passes over it."""
    try:
        checkpoint = load_checkpoint(path, "--ckpt_path")
    except ConfigError as error:
        rank_zero_warn(f"Skipping unreadable checkpoint {path} ({error})")
        return None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        rank_zero_warn(f"Skipping {path}: it holds no state_dict, so it is no Lightning checkpoint")
        return None
    return checkpoint


def newest_checkpoint(
    config: Any, root: Path, resumable: bool = False, job: str | None = None
) -> tuple[Path, dict] | None:
    """The experiment's newest readable checkpoint over all its runs, newest file first.

    ``resumable``: only one that holds the optimizer state a resumed ``fit`` continues from, not
    one saved with weights only. ``job``: only in a run that batch job trains (``claim.JOB_FILE``)."""
    candidates = sorted(root.glob("*/checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    if job is not None:
        candidates = [p for p in candidates if trained_by(p.parent.parent, job)]
    if logger_kind(config) is not None:
        candidates = [p for p in candidates if same_experiment(p.parent.parent, config)]
    for path in candidates:
        checkpoint = read_checkpoint(path)
        if checkpoint is not None and resumable and "optimizer_states" not in checkpoint:
            rank_zero_warn(f"Skipping {path}: it holds weights only, no optimizer state to resume from")
        elif checkpoint is not None:
            return path, checkpoint
    return None


def trained_by(run: Path, job: str) -> bool:
    """Whether batch job ``job`` trains in ``run`` (the job id its claim recorded)."""
    try:
        return (run / JOB_FILE).read_text().strip() == job
    except OSError:
        return False


def best_of_run(newest: Path, checkpoint: dict) -> Path | None:
    """The best checkpoint recorded by the run that wrote ``newest``: the ``best_model_path`` of its
    monitoring ``ModelCheckpoint``, looked up by file name in that run's own folder only, so a path
    stored in a checkpoint can never point the command elsewhere."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_path"):
            best = newest.parent / Path(str(state["best_model_path"])).name
            if best.is_file():
                return best
    return None


def ignored_model_settings(given: Any, used: Any, subcommand: str) -> str | None:
    """What to say when the checkpoint's hyperparameters replaced model settings the configs or
    flags gave (``given``: the model's config before, ``used``: after); None when none differ.

    LightningCLI rebuilds the model from the hyperparameters stored in the ``--ckpt_path``
    checkpoint, for every command, and a resumed ``fit`` then restores the optimizer's and the
    scheduler's state as well (learning rate, weight decay, the schedule's base rates and length).
    """
    before, after = flat(given.as_dict(), "model"), flat(used.as_dict(), "model")
    # Left unset (None): the facts the data module links in once the classes are built.
    changed = [(k, v, after[k]) for k, v in before.items() if v is not None and after.get(k, v) != v]
    if subcommand != "fit":  # what only training uses is no loss to an evaluation
        training = ("model.init_args.optimizer", "model.init_args.scheduler")
        changed = [c for c in changed if not c[0].startswith(training)]
    if not changed:
        return None
    listed = "; ".join(f"{key}={old!r} (the checkpoint's {new!r} is used)" for key, old, new in changed)
    message = (
        f"--ckpt_path: the model is built from the checkpoint's own hyperparameters, so these settings "
        f"were ignored: {listed}."
    )
    if subcommand != "fit":
        return message
    if "init_from" in (given.get("init_args") or {}):
        how = (
            "start a new run from them: --model.init_args.init_from=<the checkpoint> in place of --ckpt_path"
        )
    else:
        how = f"start a new run ({given.get('class_path')} has no init_from to start from saved weights)"
    return f"{message} Resuming continues the run as it was; to train its weights with other settings, {how}."


def flat(tree: Any, prefix: str) -> dict[str, Any]:
    """A nested mapping's leaves by dotted key."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    return {k: v for name, sub in tree.items() for k, v in flat(sub, f"{prefix}.{name}").items()}

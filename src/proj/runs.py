"""The run directory: where a run writes, which checkpoint a command resumes or evaluates, and
keeping what earlier commands wrote there.

Every command works in one ``<save_dir>/<name>/<version>/`` folder: ``fit`` in a new one (or, when it
resumes, in its checkpoint's), ``validate``/``test``/``predict`` in the folder of the checkpoint they
evaluate. A process holds its folder with a lock for as long as it runs, so two commands never
interleave their files.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from proj.logger_media import upload_config, upload_config_to_mlflow
from proj.preflight import check_ckpt_path

METRICS_FILE = "metrics.csv"
# metrics.csv is moved here while a command takes over its run directory, and written back from it:
# Lightning's CSV logger deletes an existing metrics.csv when it opens the folder. It stays until the
# command ends, so that a command that fails can put the file back as it was.
METRICS_ASIDE = ".metrics.csv.resume"
LOCK_FILE = ".lock"


class RunInUseError(RuntimeError):
    """Another live process holds the run directory."""


def run_directory(trainer: Trainer) -> str:
    """``<save_dir>/<name>/<version>`` of the first logger: the folder ``ModelCheckpoint`` also
    uses, so a run's config, checkpoints and logs sit together whatever the logger (W&B included)."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def experiment_dir(config: Any) -> Path | None:
    """``<save_dir>/<name>`` of the configured logger: the folder holding one version per run.

    For W&B that is ``<save_dir>/<project>`` (its ``name`` titles a run), shared by every
    experiment logging to the project; for MLflow, ``<save_dir>/<MLflow experiment id>``.
    """
    logger = config.trainer.get("logger")
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    if init_args is None:
        return None
    save_dir = init_args.get("save_dir") or config.trainer.get("default_root_dir") or "."
    kind = logger_kind(config)
    if kind == "wandb":
        project = init_args.get("project") or os.environ.get("WANDB_PROJECT", "lightning_logs")
        return Path(save_dir) / project
    if kind == "mlflow":
        return mlflow_experiment_dir(init_args, config.trainer.get("default_root_dir"))
    name = init_args.get("name") or init_args.get("project") or "lightning_logs"
    return Path(save_dir) / str(name)


def mlflow_experiment_dir(init_args, default_root_dir: str | None) -> Path:
    """The folder MLFlowLogger's runs get, as it names it: ``<save_dir>/<experiment id>``, where the
    id is the tracking store's, so the store is asked, and ``save_dir`` is the folder of a ``file:``
    store, else the Trainer's ``default_root_dir``. An experiment not in the store yet has no runs:
    its folder is one that does not exist."""
    from mlflow.tracking import MlflowClient

    uri = init_args.get("tracking_uri") or f"file:{init_args.get('save_dir')}"  # as MLFlowLogger does
    name = init_args.get("experiment_name")
    experiment = MlflowClient(uri).get_experiment_by_name(name)
    save_dir = uri.removeprefix("file:") if uri.startswith("file:") else default_root_dir or "."
    return Path(save_dir) / (experiment.experiment_id if experiment else f"(no MLflow experiment {name})")


def logger_kind(config) -> str | None:
    """``"wandb"`` or ``"mlflow"``: the loggers whose run directories are named by the run's own id
    and share a folder with other experiments' runs; None for the others."""
    cls = logger_class(config)
    if cls is None:
        return None
    return "wandb" if issubclass(cls, WandbLogger) else "mlflow" if issubclass(cls, MLFlowLogger) else None


def logger_class(config) -> type | None:
    """The class of the configured logger, None without one."""
    logger = config.trainer.get("logger")
    class_path = logger.get("class_path") if hasattr(logger, "get") else None
    if not class_path:
        return None
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def same_experiment(run: Path, config) -> bool:
    """Whether a run directory in a shared folder belongs to this experiment, by the config it saved.

    A W&B run carries the experiment's ``name`` (its title). MLFlowLogger takes no name, so the
    experiment's is dropped when the overlay swaps the logger in: an MLflow run belongs if it trains
    the same model, network and data classes.
    """
    kind = logger_kind(config)

    def identity(config: dict) -> tuple:
        if kind == "wandb":
            return (config["trainer"]["logger"]["init_args"].get("name"),)
        net = config["model"].get("init_args", {}).get("net")
        net = net.get("class_path") if isinstance(net, dict) else net
        return config["model"]["class_path"], net, config["data"]["class_path"]

    try:
        return identity(yaml.safe_load((run / "config.yaml").read_text())) == identity(config.as_dict())
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return False


def read_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path`` (tensors memory-mapped, no code run), or None with a warning when
    it cannot be read (a truncated save, something that is no checkpoint)."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        rank_zero_warn(f"Skipping unreadable checkpoint {path} ({type(error).__name__}: {error})")
        return None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        rank_zero_warn(f"Skipping {path}: it holds no state_dict, so it is no Lightning checkpoint")
        return None
    return checkpoint


def newest_checkpoint(config: Any, root: Path, resumable: bool = False) -> tuple[Path, dict] | None:
    """The experiment's newest readable checkpoint over all its runs, newest file first.

    ``resumable``: only one that holds the optimizer state a resumed ``fit`` continues from, not
    one saved with weights only."""
    candidates = sorted(root.glob("*/checkpoints/*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    if logger_kind(config) is not None:
        candidates = [p for p in candidates if same_experiment(p.parent.parent, config)]
    for path in candidates:
        checkpoint = read_checkpoint(path)
        if checkpoint is not None and resumable and "optimizer_states" not in checkpoint:
            rank_zero_warn(f"Skipping {path}: it holds weights only, no optimizer state to resume from")
        elif checkpoint is not None:
            return path, checkpoint
    return None


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


def version_of(run: Path, root: Path, numbered: bool) -> int | str | None:
    """The logger ``version`` (or run id) that writes into ``run``, when ``run`` is one of
    ``root``'s runs. ``numbered``: the logger counts ``version_N`` folders (W&B and MLflow name
    them by run id, which may be all digits)."""
    if run.parent.resolve() != root.resolve():
        return None
    number = run.name.removeprefix("version_")
    return int(number) if numbered and number.isdigit() and run.name.startswith("version_") else run.name


class RunLock:
    """An exclusive ``flock`` on ``<run>/.lock``, holding the holder's PID.

    The operating system drops the lock when its process ends, however it ends, so a killed run
    never leaves a stale lock behind. Locks are per process and re-entrant: the commands of one
    notebook or test take the same folder one after the other.
    """

    _held: ClassVar[dict[Path, int]] = {}
    # The run directories this process made, each with the folders made for it (runs/, runs/<name>/):
    # a command refused once it started leaves none behind.
    _created: ClassVar[dict[Path, list[Path]]] = {}

    @classmethod
    def acquire(cls, run: Path) -> None:
        run = run.resolve()
        if run in cls._held:
            return
        if not run.exists():
            cls._created[run] = [folder for folder in run.parents if not folder.exists()]
        run.mkdir(parents=True, exist_ok=True)
        fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUseError(
                f"The run directory {run} is in use by another process (PID {holder}): two commands "
                "writing one run would mix their checkpoints and logs. Wait for it to end (or stop it), "
                "then run this again; to evaluate a checkpoint meanwhile, copy it outside runs/ first."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        cls._held[run] = fd

    @classmethod
    def release_all(cls) -> None:
        for fd in cls._held.values():
            os.close(fd)
        cls._held.clear()
        cls._created.clear()

    @classmethod
    def remove_new_runs(cls) -> None:
        """Delete the run directories this process made, unless a checkpoint was saved there, and the
        folders made for them once empty: for a command refused after it started, so that a fixed
        rerun gets the same version number."""
        for run, folders in cls._created.items():
            if any(run.glob("checkpoints/*.ckpt")):
                continue
            shutil.rmtree(run, ignore_errors=True)
            for folder in folders:  # innermost first; another run may have been made there since
                with contextlib.suppress(OSError):
                    folder.rmdir()
        cls._created.clear()


def remove_stale_temporaries(run: Path) -> None:
    """Files that a killed process left half-written: checkpoint saves (``AtomicCheckpointIO``'s
    ``.<name>.<pid>.tmp``), predictions and rewritten ``metrics.csv`` (the same names, in the run
    directory). Only called while holding the run's lock, so no write is under way."""
    for stale in [*run.glob(".*.tmp"), *(run / "checkpoints").glob(".*.tmp")]:
        stale.unlink(missing_ok=True)


def take_metrics_aside(run: Path) -> Path | None:
    """Move ``metrics.csv`` out of the CSV logger's way before it opens the folder, and keep it
    there until the command ends (``KeptMetrics``): a command that fails puts it back.

    An aside file left by an earlier command means that command died: it is the complete copy and
    wins over the ``metrics.csv`` the dead command wrote, unless that command had written a
    checkpoint, which holds its rows (a resume drops the ones after it).
    """
    current, aside = run / METRICS_FILE, run / METRICS_ASIDE
    if aside.is_file() and not checkpointed_since(aside):
        current.unlink(missing_ok=True)
    elif current.is_file():
        os.replace(current, aside)
    elif not aside.is_file():
        return None
    # Its time marks when this command took the run over: the checkpoints written later are its own.
    os.utime(aside)
    KeptMetrics.asides.append(aside)
    return aside


def checkpointed_since(aside: Path) -> bool:
    """Whether a checkpoint of the run was written after ``aside`` was taken aside."""
    taken = aside.stat().st_mtime_ns
    return any(p.stat().st_mtime_ns > taken for p in (aside.parent / "checkpoints").glob("*.ckpt"))


class KeptMetrics:
    """The ``metrics.csv`` files this process took aside, each kept until its command ends.

    A command that succeeded, or failed after writing a checkpoint, keeps the rows it added; any
    other failed command (a resume refused at start, an unwritable or full checkpoint folder) puts
    the file back byte for byte, so it leaves no row of an epoch that no checkpoint holds.
    """

    asides: ClassVar[list[Path]] = []

    @classmethod
    def settle(cls, failed: bool) -> None:
        for aside in cls.asides:
            if not aside.is_file():
                continue
            if failed and not checkpointed_since(aside):
                os.replace(aside, aside.with_name(METRICS_FILE))
            else:
                aside.unlink()
        cls.asides.clear()


def restore_metrics(logger: CSVLogger, aside: Path) -> None:
    """Write every row of ``aside`` into the logger's new ``metrics.csv``.

    All of them: a resumed run that fails to start must leave them all. The rows its checkpoint
    had not seen go once the resumed run starts training (``rows_before``).
    """
    with open(aside, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        step = int(row.pop("step"))
        logger.log_metrics({k: _number(v) for k, v in row.items() if v not in ("", None)}, step=step)
    logger.save()


def rewrite_rows(logger: CSVLogger, keep: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    """Replace the rows of the logger's ``metrics.csv`` by ``keep(rows)``, atomically."""
    path = Path(logger.log_dir) / METRICS_FILE
    if not path.is_file():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        fields = reader.fieldnames or []
    kept = keep(rows)
    if len(kept) == len(rows):
        return
    temporary = path.with_name(f".{METRICS_FILE}.{os.getpid()}.tmp")
    with open(temporary, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(temporary, path)


def rows_before(step: int) -> Callable[[list[dict[str, str]]], list[dict[str, str]]]:
    """Rows logged before optimizer step ``step``: a checkpoint at ``global_step == step`` has seen
    them; the run that resumes it logs the later ones again. Test rows stay wherever they are: no
    training logs them again (a finished run's test, resumed to train longer)."""
    return lambda rows: [row for row in rows if int(row["step"]) < step or tested(row)]


def tested(row: dict[str, str]) -> bool:
    """Whether a row holds test metrics only (beside its step and epoch)."""
    names = [name for name, value in row.items() if value and name not in ("step", "epoch")]
    return bool(names) and all(name.startswith("test/") for name in names)


def without_repeats(step: int) -> Callable[[list[dict[str, str]]], list[dict[str, str]]]:
    """Rows of ``step`` logged twice (the same names) kept once, the later one.

    Rows that share the step of a checkpoint may come before or after it: whether the resumed
    run logs them again (the epoch-end metrics of an epoch whose last batch was checkpointed) is
    Lightning's to decide, so both are kept until the second copy shows.
    """

    def keep(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        names = [
            frozenset(k for k, v in row.items() if v) if int(row["step"]) == step else None for row in rows
        ]
        return [row for i, row in enumerate(rows) if names[i] is None or names[i] not in names[i + 1 :]]

    return keep


def _number(text: str) -> int | float:
    """A CSV cell as the logger first wrote it: ``epoch`` stays ``3``, a loss keeps every digit."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def resolve_checkpoint(config, subcommand: str, parser: LightningArgumentParser) -> dict | None:
    """Turn ``--ckpt_path`` into the file the command loads, check it, and point the logger at that
    checkpoint's own run directory (for W&B and MLflow: the same run, whose id is the folder's name).
    Returns the checkpoint as read for the checks (tensors memory-mapped), None when none is.

    ``last`` is the experiment's newest readable checkpoint over all its runs (``auto`` in ``fit``:
    the same, or a fresh start when there is none, for job scripts that requeue); ``best`` is the
    best checkpoint of that newest run. Lightning's own ``last`` and ``best`` look only in the new
    run's empty folder and then quietly fall back to untrained weights. ``validate``, ``test`` and
    ``predict`` never evaluate untrained weights unless ``--allow_untrained`` says so.
    """
    ckpt_path = config.get("ckpt_path")
    evaluating = subcommand != "fit"
    if ckpt_path is None:
        if evaluating and not config.get("allow_untrained") and not config.model.init_args.get("init_from"):
            parser.error(
                f"`{subcommand}` without --ckpt_path would use untrained weights. Pass --ckpt_path last "
                "(the experiment's newest checkpoint), --ckpt_path best (the best of its newest run) or "
                "the path of a .ckpt file; to evaluate untrained weights on purpose, --allow_untrained=true."
            )
        return
    if ckpt_path in ("hpc", "registry") or str(ckpt_path).startswith("registry:"):
        return
    root = experiment_dir(config)
    checkpoint = None
    if ckpt_path in ("last", "auto", "best"):
        if root is None:
            parser.error(
                f"--ckpt_path {ckpt_path}: the config has no logger, so there is no "
                "runs/<experiment>/ folder to look in. Pass the path of a .ckpt file instead."
            )
        found = newest_checkpoint(config, root, resumable=not evaluating)
        if found is None and ckpt_path == "auto" and not evaluating:
            config.ckpt_path = None
            return
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
        if ckpt_path == "best":
            best = best_of_run(path, checkpoint)
            if best is None:
                parser.error(
                    f"--ckpt_path best: the newest run, {path.parent.parent}, recorded no best checkpoint "
                    "(no monitored ModelCheckpoint saved one). Use --ckpt_path last, or a .ckpt path."
                )
            path, checkpoint = best, None
        config.ckpt_path = ckpt_path = str(path)
    # The newest checkpoint was read while searching: checked as read, not read again.
    checkpoint = check_ckpt_path(ckpt_path, parser, config, checkpoint)
    if not evaluating and "optimizer_states" not in checkpoint:
        parser.error(
            f"--ckpt_path: '{ckpt_path}' holds weights only, no optimizer state, so `fit` cannot resume "
            "from it. To start training from these weights, use model.init_args.init_from where the "
            "model has it; to evaluate them, use `test` or `validate`."
        )
    run = Path(ckpt_path).resolve().parent.parent
    if root is not None and Path(ckpt_path).parent.name == "checkpoints":
        kind = logger_kind(config)
        version = version_of(run, root, numbered=kind is None)
        if version is not None and kind == "mlflow":  # MLFlowLogger takes the run's id, and no version
            config.trainer.logger.init_args.run_id = version
        elif version is not None:
            config.trainer.logger.init_args.version = version
        tensorboard = issubclass(logger_class(config) or object, TensorBoardLogger)
        if version is not None and not evaluating and tensorboard:
            # TensorBoard's own remedy for a resumed run: its reader drops the events from this step
            # on that the killed run wrote, which the resumed one writes again.
            logger = config.trainer.logger
            logger.dict_kwargs = {
                **(logger.get("dict_kwargs") or {}),
                "purge_step": checkpoint["global_step"],
            }
    return checkpoint


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
        changed = [
            c
            for c in changed
            if not c[0].startswith(("model.init_args.optimizer", "model.init_args.scheduler"))
        ]
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


def claim_run_directory(trainer: Trainer) -> None:
    """Hold the run directory for this process, clear what a killed process left half-done there,
    and carry every row of its ``metrics.csv`` over, which the CSV logger would delete."""
    if not trainer.is_global_zero or trainer.fast_dev_run or not trainer.loggers:
        return
    if trainer.loggers[0].version is None:  # a new W&B run: its own fresh id, nothing to keep
        return
    run = Path(run_directory(trainer))
    RunLock.acquire(run)
    remove_stale_temporaries(run)
    if isinstance(trainer.logger, CSVLogger):
        aside = take_metrics_aside(run)
        if aside is not None:
            restore_metrics(trainer.logger, aside)
    rank_zero_info(f"Run directory: {run}")


class RunConfigSaver(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run directory, once per run, and hands it
    to W&B or MLflow when the run logs there.

    Lightning's own callback writes to ``trainer.log_dir``, which for W&B is the shared ``save_dir``:
    a second run there collides with the first. The run directory is decided on rank 0 and
    broadcast, so under DDP every rank agrees and only rank 0 writes.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        run_dir = trainer.strategy.broadcast(run_directory(trainer))
        path = Path(run_dir) / self.config_filename
        # A resumed run continues in its own directory: the config that started it stays.
        if trainer.is_global_zero:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                self.parser.save(self.config, path, skip_unset=False, multifile=self.multifile)
            for logger in trainer.loggers:
                if isinstance(logger, WandbLogger):
                    upload_config(logger, path)
                elif isinstance(logger, MLFlowLogger):
                    upload_config_to_mlflow(logger, path)
        self.already_saved = True

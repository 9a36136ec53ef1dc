"""Hyperparameter sweeps with Optuna:
``python -m proj sweep --config configs/sweeps/digits_optuna.yaml``.

A sweep config names the experiment's configs, the search space (the CLI's own dotted keys), the metric
and its direction, the number of trials, the sampler and the pruner. Each trial is an ordinary
``python -m proj fit`` in a process of its own, with the trial's values as ``--key=value`` flags,
so its saved ``config.yaml`` repeats it alone; the process is forked from one that has imported
torch and Lightning (``proj.preloaded``), as importing them again took half of a short CPU trial.
The study lives in a real database: SQLite in ``runs/sweeps/<name>/study.db`` unless ``--storage``
names another (PostgreSQL, MySQL), which is how workers on several machines share one study; workers
on one machine share the SQLite file.

Resuming is starting the same command again: a trial left running by a worker that died (its process
gone from this machine, or its heartbeat silent for ``GRACE_PERIOD_S`` on any machine) is marked
failed and retried once with the same values, and workers start trials until ``n_trials`` have
finished (complete or pruned) across all of them.

This module runs the sweep and imports neither torch nor Lightning (its trials' server does): a
worker waits on its trials' processes at little cost. The trial's side, reporting the metric and
obeying the pruner, is ``proj.callbacks.pruning.OptunaPruning``, which the CLI adds when
``TRIAL_ENV`` is set.
"""

from __future__ import annotations

import argparse
import csv
import functools
import inspect
import json
import math
import os
import re
import signal
import socket
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, Literal

import optuna
import yaml
from jsonargparse import ArgumentError, ArgumentParser, Namespace
from jsonargparse.typing import NotEmptyStr, PositiveInt, restricted_string_type
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import Engine, make_url

from proj import TRIAL_ENV, preloaded

SWEEPS_ROOT = Path("runs") / "sweeps"
# A worker's heartbeat, written while its trial runs: another machine's worker fails a trial whose
# heartbeat is older than the grace period (its worker died or lost the network).
HEARTBEAT_INTERVAL_S = 20
GRACE_PERIOD_S = 90
# A sweep whose trials keep failing (a metric the model does not log, a range that diverges) stops
# rather than sampling on: it might never reach n_trials.
MAX_FAILURES_IN_A_ROW = 3
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
DISTRIBUTIONS = {"float": FloatDistribution, "int": IntDistribution, "categorical": CategoricalDistribution}
# The fields of a sweep config besides the sampler and the pruner: each one's type, and its fix.
FIELDS: dict[str, tuple[Any, str]] = {
    "configs": (str | list[str], "list the experiment's config files, e.g. `configs: [configs/digits.yaml]`"),
    "flags": (list[restricted_string_type("Flag", "^--")], "flags such as `--trainer.max_epochs=10`, a list"),
    "metric": (NotEmptyStr, "the logged metric to optimise, e.g. `metric: val/loss`"),
    "direction": (Literal["minimize", "maximize"], "write `minimize` (a loss) or `maximize` (an accuracy)"),
    "n_trials": (PositiveInt, "the number of trials to finish, a positive integer"),
    "space": (
        dict[str, Any],
        "map each dotted CLI key to a distribution, e.g. "
        "`model.init_args.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}`",
    ),
}
HOST = socket.gethostname()
# Heartbeats, stale trials and the matplotlib plots are "experimental" in Optuna 4: used as documented.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class SweepConfigError(ValueError):
    """The sweep config is wrong; the message names the field and the fix."""


class TrialFailed(RuntimeError):
    """A trial's run failed; the sweep goes on with the next trial."""


@dataclass
class Sweep:
    """A sweep config, validated (see ``configs/sweeps/digits_optuna.yaml`` for every field)."""

    path: Path
    name: str
    configs: list[str]
    flags: list[str]
    metric: str
    direction: str
    n_trials: int
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    space: dict[str, BaseDistribution]

    @property
    def folder(self) -> Path:
        """``runs/sweeps/<name>/``: the SQLite study, the trials' run directories and the results."""
        return SWEEPS_ROOT / self.name


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep config, so that a mistake stops the sweep before any trial runs."""
    path = Path(path)
    if not path.is_file():
        raise SweepConfigError(
            f"{path}: no such file. Pass the sweep config, e.g. configs/sweeps/digits_optuna.yaml"
        )
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise SweepConfigError(f"{path}: a sweep config is a mapping of fields (configs, space, metric, ...)")
    if "method" in spec or "command" in spec:
        raise SweepConfigError(
            f"{path}: this is a W&B sweep spec; run it with `wandb sweep {path}` (see docs/sweeps.md)."
        )

    def fail(field: str, problem: str) -> SweepConfigError:
        return SweepConfigError(f"{path}: {field}: {problem}")

    if unknown := sorted(set(spec) - set(FIELDS) - {"sampler", "pruner"}):
        raise fail(
            unknown[0], f"unknown field; the fields are {', '.join(sorted([*FIELDS, 'sampler', 'pruner']))}"
        )
    fields = parse_fields(spec, fail)
    configs = [fields.configs] if isinstance(fields.configs, str) else fields.configs
    for config in configs:
        if not Path(config).is_file():
            raise fail(
                "configs", f"no file '{config}' (paths are relative to the folder the sweep starts in)"
            )
    sweep = Sweep(
        path=path,
        name=path.stem,
        configs=configs,
        flags=[str(flag) for flag in fields.flags],
        metric=fields.metric,
        direction=fields.direction,
        n_trials=fields.n_trials,
        sampler=spec.get("sampler") or {"class_path": "TPESampler"},
        pruner=spec.get("pruner") or {"class_path": "NopPruner"},
        space={key: distribution(f"space.{key}", entry, fail) for key, entry in fields.space.items()},
    )
    check_sampler(sweep)  # an unknown class or argument, or a package it lacks: here, not in a trial
    build_pruner(sweep.pruner, str(path))
    return sweep


def check_sampler(sweep: Sweep) -> None:
    """Build the sampler and draw two points of the space in a study held in memory: some of Optuna's
    samplers import a package of their own only when they first sample from a finished trial
    (QMCSampler SciPy, CmaEsSampler cmaes), which the project does not install."""
    sampler = build_sampler(sweep)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the probe's study is not the user's
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study = optuna.create_study(sampler=sampler, direction=sweep.direction)
            study.tell(study.ask(sweep.space), 0.0)
            study.ask(sweep.space)
    except ModuleNotFoundError as error:
        raise SweepConfigError(
            f"{sweep.path}: sampler: {type(sampler).__name__} needs the package '{error.name}', which is "
            f"not installed. Install it (`uv add {error.name}`) or choose another sampler, e.g. TPESampler."
        ) from None
    finally:
        optuna.logging.set_verbosity(verbosity)


def parse_fields(spec: dict[str, Any], fail) -> Namespace:
    """The fields of ``FIELDS``, typed by jsonargparse; a wrong or missing one refused with its fix."""
    parser = ArgumentParser(exit_on_error=False)
    for field, (kind, _) in FIELDS.items():
        parser.add_argument(f"--{field}", type=kind, default=[] if field == "flags" else None)
    given = {field: value for field, value in spec.items() if field in FIELDS and value is not None}
    try:
        fields = parser.parse_object(given)
    except ArgumentError as error:
        named = re.search(r'key "(\w+)"', str(error))
        field = named.group(1) if named else next(iter(given))
        raise fail(field, f"'{given.get(field)}': {FIELDS[field][1]}") from None
    if missing := [field for field in FIELDS if field != "flags" and fields[field] in (None, "", [], {})]:
        raise fail(missing[0], f"missing: {FIELDS[missing[0]][1]}")
    return fields


def distribution(field: str, spec: Any, fail) -> BaseDistribution:
    """One search-space entry as Optuna's own distribution, which refuses a range it cannot sample:
    ``{type: float|int, low, high, log?, step?}`` or ``{type: categorical, choices: [...]}``."""
    kind = spec.get("type") if isinstance(spec, dict) else spec
    if not isinstance(spec, dict) or kind not in DISTRIBUTIONS:
        raise fail(
            field,
            f"unknown distribution '{kind}'; give `type:` float (with `log: true` for a log "
            "scale), int or categorical",
        )
    settings = {name: value for name, value in spec.items() if name != "type"}
    if text := [f"`{bound}`" for bound in ("low", "high") if isinstance(settings.get(bound), str)]:
        raise fail(field, f"{' and '.join(text)} must be numbers (YAML reads 1e-4 as text: write 1.0e-4)")
    cls = DISTRIBUTIONS[kind]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Optuna only warns of choices its storage cannot hold
            return cls(**settings)
    except TypeError:
        raise fail(
            field, f"a {kind} takes {', '.join(inspect.signature(cls).parameters)}, got {spec}"
        ) from None
    except (ValueError, UserWarning) as error:
        raise fail(field, str(error).splitlines()[0]) from None


def component(spec: Any, base: type, field: str, source: str) -> Any:
    """The sampler or pruner a ``{class_path, init_args}`` entry names (a bare class name is one of
    ``optuna.samplers`` or ``optuna.pruners``), parsed and built by jsonargparse."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument(f"--{field}", type=base)
    try:
        return parser.instantiate(parser.parse_object({field: spec}))[field]
    except (ArgumentError, TypeError, ValueError) as error:
        module = import_module(f"optuna.{field}s")
        names = ", ".join(n for n in module.__all__ if n[0].isupper() and not n.startswith("Base"))
        lines = [line.strip() for line in str(error).splitlines()[1:3]] or [str(error)]
        problem = " ".join(lines if lines[0].endswith(":") else lines[:1])  # jsonargparse's reason
        raise SweepConfigError(
            f"{source}: {field}: {problem}. Give `class_path:`, one of {module.__name__}: {names}, "
            "and its `init_args:`"
        ) from None


def build_sampler(sweep: Sweep, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """The sweep's sampler. ``seed_offset`` moves a configured seed, so that workers sharing a study
    do not all sample the same values."""
    init_args = dict(sweep.sampler.get("init_args") or {}) if isinstance(sweep.sampler, dict) else {}
    if seed_offset and init_args.get("seed") is not None:
        init_args["seed"] = (init_args["seed"] + seed_offset) % 2**32
    spec = {**sweep.sampler, "init_args": init_args} if isinstance(sweep.sampler, dict) else sweep.sampler
    return component(spec, optuna.samplers.BaseSampler, "sampler", str(sweep.path))


def build_pruner(spec: dict[str, Any], source: str) -> optuna.pruners.BasePruner:
    """The sweep's pruner (the worker's and, rebuilt from the same entry, its trials')."""
    return component(spec, optuna.pruners.BasePruner, "pruner", source)


def suggest(trial: optuna.Trial, space: dict[str, BaseDistribution]) -> dict[str, Any]:
    """The trial's values, one per key of the search space."""
    values = {}
    for key, d in space.items():
        if isinstance(d, CategoricalDistribution):
            values[key] = trial.suggest_categorical(key, d.choices)
        else:
            suggest_number = trial.suggest_int if isinstance(d, IntDistribution) else trial.suggest_float
            values[key] = suggest_number(key, d.low, d.high, step=d.step, log=d.log)
    return values


def trial_flags(values: dict[str, Any]) -> list[str]:
    """``--key=value`` for each value: strings as they are, the rest as JSON (``true``, ``null``)."""
    return [
        f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in values.items()
    ]


def trial_args(sweep: Sweep, values: dict[str, Any], number: int) -> list[str]:
    """The trial's ``python -m proj fit``: the sweep's configs and flags, the trial's values, and a
    run directory under ``runs/sweeps/<name>/trial_<number>/`` (the logger's ``save_dir`` and ``name``, so
    that repeating its config.yaml writes the next version beside it)."""
    command = ["fit"]
    for config in sweep.configs:
        command += ["--config", config]
    return [
        *command,
        *sweep.flags,
        *trial_flags(values),
        f"--trainer.logger.init_args.save_dir={sweep.folder}",
        f"--trainer.logger.init_args.name=trial_{number}",
    ]


def storage_for(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats (a trial whose worker went silent is failed and retried
    once with the same values). SQLite waits for a busy database rather than erring at once: several
    workers and their trials write to one file."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    sqlite = url.startswith("sqlite")
    if sqlite:
        check_sqlite_file(url)
    attempt = 1
    while True:
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else {},
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
            )
            break
        except ArgumentError as error:  # an unknown database kind, a malformed URL: no retry helps
            raise storage_refused(url, error) from None
        except SQLAlchemyError as error:
            # Workers started together on a new database race to create its tables; the loser finds
            # them made on its next try.
            if attempt == 5:
                raise storage_refused(url, error) from None
            time.sleep(attempt)
            attempt += 1
    if sqlite:
        lock_at_begin(storage.engine)
    return storage


def check_sqlite_file(url: str) -> None:
    """An SQLite study file must be one SQLite can open: in an existing folder, and an SQLite
    database (or empty) where it exists. Said at once, rather than after the retries."""
    name = make_url(url).database
    if not name or name == ":memory:":
        return
    path = Path(name)
    if not path.parent.is_dir():
        raise SweepConfigError(
            f"--storage {url}: the folder {path.parent}/ does not exist, so SQLite cannot create "
            f"{path.name} there. Create the folder, or give a path in an existing one."
        )
    if path.is_dir():
        raise SweepConfigError(f"--storage {url}: {path} is a folder, not an SQLite file. Name a file in it.")
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SweepConfigError(
            f"--storage {url}: cannot read {path} ({error.strerror}). Check its permissions."
        ) from None
    if head and head != b"SQLite format 3\0":
        raise SweepConfigError(
            f"{path}: not an SQLite database, so it holds no study (overwritten or another file?). Move "
            "it aside to start the study afresh, or pass --storage with the study's real database."
        )


def shown_url(url: str) -> str:
    """``url`` as logs may show it: without its password."""
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        raise SweepConfigError(
            f"--storage {url}: not a database URL. Give an SQLAlchemy URL, e.g. "
            "sqlite:///runs/sweeps/study.db or postgresql://user@host/db."
        ) from None


def storage_refused(url: str, error: Exception) -> SweepConfigError:
    """The refusal of a study database that cannot be opened: the URL (without its password) and why."""
    shown = shown_url(url)
    reason = str(getattr(error, "orig", None) or error).splitlines()[0]
    return SweepConfigError(
        f"--storage {shown}: cannot open the study's database ({reason}). Give an SQLAlchemy URL that "
        "works here, e.g. sqlite:///runs/sweeps/study.db or postgresql://user@host/db."
    )


def lock_at_begin(engine: Engine) -> None:
    """Make each SQLite transaction take the database's write lock when it begins.

    Optuna takes a queued trial (enqueued, or a retry of a dead worker's) by reading it as waiting and
    then marking it running, with ``SELECT ... FOR UPDATE`` to keep others out in between. SQLite has
    no such lock, and Python's driver begins a transaction only at the first write, so two workers
    could both read the same trial as waiting and both run it (optuna#4621); the second then fails
    to record its result. Beginning with ``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for pysqlite) makes
    the read and the write one step that workers take in turn, waiting up to the timeout."""
    from sqlalchemy import event

    def driver_leaves_transactions_to_sqlalchemy(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    def begin_with_write_lock(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(engine, "connect", driver_leaves_transactions_to_sqlalchemy)
    event.listen(engine, "begin", begin_with_write_lock)
    engine.dispose()  # the connections the storage opened to create its tables predate the hooks


def default_storage(sweep: Sweep) -> str:
    return f"sqlite:///{(sweep.folder / 'study.db').resolve()}"


def open_study(sweep: Sweep, storage: optuna.storages.RDBStorage) -> optuna.Study:
    """Create the study, or join it. The worker that creates it samples with the configured seed, so
    a sweep of one worker repeats; a worker that joins offsets the seed by its process id."""
    try:
        return optuna.create_study(
            storage=storage,
            study_name=sweep.name,
            direction=sweep.direction,
            sampler=build_sampler(sweep),
            pruner=build_pruner(sweep.pruner, str(sweep.path)),
        )
    except optuna.exceptions.DuplicatedStudyError:
        pass
    study = optuna.load_study(
        study_name=sweep.name,
        storage=storage,
        sampler=build_sampler(sweep, seed_offset=os.getpid()),
        pruner=build_pruner(sweep.pruner, str(sweep.path)),
    )
    if study.direction.name.lower() != sweep.direction:
        raise SweepConfigError(
            f"{sweep.path}: direction: the study '{sweep.name}' in the storage is to "
            f"{study.direction.name.lower()}; use that, or another storage or config name for a new study"
        )
    return study


def fresh(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` as the storage holds it now, with what its run recorded."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def fail_dead_trials(study: optuna.Study, storage: optuna.storages.RDBStorage) -> None:
    """Fail the trials a dead worker left running: on this machine, those whose worker's process is
    gone (at once); on any machine, those whose heartbeat stopped (after the grace period). Each is
    retried once with the same values."""
    # Optuna calls this too, but only in `optimize` before it asks for a trial: the worker counts the
    # running trials before that, and one of a silent worker would count as running and end the sweep.
    optuna.storages.fail_stale_trials(study)
    retry = storage.get_heartbeat_stale_trial_callback()
    trials = {trial.number: trial for trial in study.get_trials(deepcopy=False)}
    for trial in trials.values():
        worker = str(trial.user_attrs.get("worker", ""))
        retried = trials.get(next(reversed(RetryHeartbeatStaleTrialCallback.retry_history(trial)), None))
        if trial.state != TrialState.RUNNING or (retried and retried.user_attrs.get("worker") == worker):
            # A retry holds the attributes of the trial it retries until its worker names itself.
            continue
        pid = local_pid(worker)
        if pid is not None and pid != os.getpid() and not process_alive(pid):
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except (ValueError, RuntimeError):  # another worker failed it first
                continue
            print(f"trial {trial.number}: its worker (PID {pid}) is gone; marked failed, to be retried")
            if retry is not None:
                retry(study, fresh(study, trial.number))


def cpu_cores() -> int:
    """The cores this process may run on: a container's or a batch job's share, not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def register_worker(sweep: Sweep) -> Path:
    """A file naming this worker (``<host>:<pid>``) in ``runs/sweeps/<name>/workers/``, from which the
    workers on one machine count each other (``workers_here``)."""
    path = sweep.folder / "workers" / this_worker()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def workers_here(sweep: Sweep) -> int:
    """The live workers of this sweep on this machine, this one included. A killed worker's file
    outlives it; its process does not, and the file goes."""
    alive = 0
    for path in (sweep.folder / "workers").glob("*:*"):
        pid = local_pid(path.name)
        if pid is None:  # another machine's, on a shared file system
            continue
        if process_alive(pid):
            alive += 1
        else:
            path.unlink(missing_ok=True)
    return max(alive, 1)


def trial_threads(sweep: Sweep) -> tuple[int, int] | None:
    """The CPU threads each trial here may use, and the workers they are shared among: this machine's
    cores divided among its workers, as Lightning divides them among the processes of a DDP run.
    Left alone, each trial's torch starts a thread per core, and two workers' trials on 2 cores took
    a median 3.8 times as long as with one thread each (``benchmarks/sweep_workers.py``). None when
    ``OMP_NUM_THREADS`` is set: the user's choice, which the trials inherit."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    workers = workers_here(sweep)
    return max(1, cpu_cores() // workers), workers


def this_worker() -> str:
    """This worker's name, ``<host>:<pid>``: in its trials' ``worker`` attribute and its registration."""
    return f"{HOST}:{os.getpid()}"


def local_pid(worker: str) -> int | None:
    """The process id of the worker named ``worker`` (``<host>:<pid>``) when it ran on this machine."""
    host, _, pid = worker.rpartition(":")
    return int(pid) if host == HOST and pid.isdigit() else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def best_value(rows: list[dict[str, str]], metric: str, direction: str) -> float | None:
    """The best value of ``metric`` the run logged: the trial's value, as its best checkpoint is the
    best of the run."""
    values = [float(row[metric]) for row in rows if row.get(metric) not in (None, "")]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return None
    return min(values) if direction == "minimize" else max(values)


def objective_for(sweep: Sweep, storage_url: str):
    """The objective: one trial's ``fit`` in a process of its own, whose output goes to
    ``runs/sweeps/<name>/trial_<n>/output.log``."""

    said = None

    def objective(trial: optuna.Trial) -> float:
        nonlocal said
        values = suggest(trial, sweep.space)
        trial.set_user_attr("worker", this_worker())
        folder = sweep.folder / f"trial_{trial.number}"
        folder.mkdir(parents=True, exist_ok=True)
        report_to = {
            "storage": storage_url,
            "study": sweep.name,
            "trial": trial.number,
            "metric": sweep.metric,
            "pruner": sweep.pruner,
        }
        env = {**os.environ, TRIAL_ENV: json.dumps(report_to)}
        threads = trial_threads(sweep)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads[0])
            trial.set_user_attr("threads", threads[0])  # which its repeat needs: sums differ by threads
            if threads != said:
                print(
                    f"Trials here use {threads[0]} CPU thread(s) each: {threads[1]} worker(s) of this sweep "
                    f"share this machine's {cpu_cores()} cores (OMP_NUM_THREADS sets it instead).",
                    flush=True,
                )
                said = threads
        log = folder / "output.log"
        log.write_text("")
        process = preloaded.start(trial_args(sweep, values, trial.number), Path.cwd(), env, log)
        try:
            code = process.wait()
        except BaseException:  # an interrupted worker takes its trial with it
            process.send_signal(signal.SIGKILL)
            raise
        recorded = fresh(trial.study, trial.number).user_attrs
        run_dir = Path(recorded.get("run_dir", folder))
        if code == 2:  # the CLI refused the command: every trial would fail alike
            raise SweepConfigError(
                f"trial {trial.number}: the CLI refused its command ({log}):\n{tail(log, 10)}"
            )
        rows = read_metrics(run_dir)
        for key, value in last_values(rows, prefix="test/").items():
            trial.set_user_attr(key, value)
        value = best_value(rows, sweep.metric, sweep.direction)
        if code != 0 or value is None:
            error = f"exit status {code}: {tail(log, 1)}" if code else f"its run logged no {sweep.metric}"
            trial.set_user_attr("error", f"{error} (output: {log})")
            raise TrialFailed(error)
        if "pruned_at_step" in recorded:
            raise optuna.TrialPruned(f"at step {recorded['pruned_at_step']}")
        return value

    return objective


def last_values(rows: list[dict[str, str]], prefix: str) -> dict[str, float]:
    """The last logged value of each metric whose name starts with ``prefix``."""
    found = {}
    for row in rows:
        found.update({k: float(v) for k, v in row.items() if k.startswith(prefix) and v not in (None, "")})
    return found


def tail(path: Path, lines: int = 5) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return "\n".join(text[-lines:]) or "(no output)"


def describe(trial: FrozenTrial, metric: str) -> str:
    """One line for a finished trial."""
    seconds = f" in {trial.duration.total_seconds():.0f} s" if trial.duration else ""
    values = ", ".join(
        f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in trial.params.items()
    )
    if trial.state == TrialState.COMPLETE:
        outcome = f"{metric} {trial.value:.4f}"
    elif trial.state == TrialState.PRUNED:
        outcome = f"pruned at step {trial.user_attrs.get('pruned_at_step', '?')}"
    else:
        outcome = "failed"
    return f"trial {trial.number}: {outcome}{seconds} ({values})"


def run_worker(sweep: Sweep, storage_url: str, n_trials: int) -> optuna.Study:
    """Run trials until ``n_trials`` of the study have finished (complete or pruned) or are running
    in other workers; registered in ``workers/`` meanwhile, so that the workers here share the cores."""
    registration = register_worker(sweep)
    try:
        return run_trials(sweep, storage_url, n_trials)
    finally:
        registration.unlink(missing_ok=True)


def run_trials(sweep: Sweep, storage_url: str, n_trials: int) -> optuna.Study:
    storage = storage_for(storage_url)
    study = open_study(sweep, storage)
    objective = objective_for(sweep, storage_url)
    failures = 0

    def announce(study: optuna.Study, trial: FrozenTrial) -> None:
        nonlocal failures
        failures = failures + 1 if trial.state == TrialState.FAIL else 0
        reason = f": {trial.user_attrs['error']}" if "error" in trial.user_attrs else ""
        print(describe(trial, sweep.metric) + reason, flush=True)

    while True:
        fail_dead_trials(study, storage)
        states = Counter(t.state for t in study.get_trials(deepcopy=False))
        if sum(states[s] for s in FINISHED) + states[TrialState.RUNNING] >= n_trials:
            break
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SystemExit(
                f"error: {failures} trials in a row failed; see their output.log under {sweep.folder}/. "
                "Start the same command again once fixed: the study continues."
            )
        study.optimize(objective, n_trials=1, catch=(TrialFailed,), callbacks=[announce])
    return study


def writes_results(study: optuna.Study) -> bool:
    """Whether this worker writes the results: the one that finished the study's last trial, once no
    trial runs (workers started together would each write their own partial or repeated copy), or any
    worker when that one is gone from this machine (the same command started again on a done study)."""
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in FINISHED]
    if any(t.state == TrialState.RUNNING for t in trials):
        return False
    if not finished:
        return True
    worker = str(max(finished, key=lambda t: t.datetime_complete).user_attrs.get("worker", ""))
    pid = local_pid(worker)
    return worker == this_worker() or (pid is not None and not process_alive(pid))


def write_results(study: optuna.Study, sweep: Sweep, started: float) -> None:
    """Print the best trial and how to repeat it; write ``trials.csv``, ``history.png`` and
    ``importance.png`` into the sweep's folder."""
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state for t in trials)
    folder = sweep.folder
    folder.mkdir(parents=True, exist_ok=True)
    write_table(trials, folder / "trials.csv")
    written = ["trials.csv", *write_plots(study, folder)]
    print(
        f"\nSweep '{sweep.name}': {states[TrialState.COMPLETE]} complete, "
        f"{states[TrialState.PRUNED]} pruned, {states[TrialState.FAIL]} failed, "
        f"{states[TrialState.RUNNING]} still running "
        f"({time.monotonic() - started:.0f} s in this worker)"
    )
    if states[TrialState.COMPLETE]:
        best = study.best_trial
        run_dir = best.user_attrs.get("run_dir", "?")
        tests = ", ".join(f"{k} {v:.4f}" for k, v in best.user_attrs.items() if k.startswith("test/"))
        print(f"Best trial {best.number}: {sweep.metric} {best.value:.4f}" + (f" ({tests})" if tests else ""))
        for key, value in best.params.items():
            print(f"  {key} = {value}")
        print(f"  run directory: {run_dir}")
        threads = f"OMP_NUM_THREADS={best.user_attrs['threads']} " if "threads" in best.user_attrs else ""
        print(f"  repeat it:     {threads}python -m proj fit --config {run_dir}/config.yaml")
    print(f"Written into {folder}/: {', '.join(written)}")


def write_table(trials: Sequence[FrozenTrial], path: Path) -> None:
    """One row per trial: state, value, duration, its values, what it recorded (test metrics, run
    directory, the step it was pruned at)."""
    params = sorted({k for t in trials for k in t.params})
    attrs = sorted({k for t in trials for k in t.user_attrs})
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["number", "state", "value", "duration_s", *params, *attrs])
        for t in trials:
            duration = f"{t.duration.total_seconds():.1f}" if t.duration else ""
            writer.writerow(
                [t.number, t.state.name, "" if t.value is None else t.value, duration]
                + [t.params.get(k, "") for k in params]
                + [t.user_attrs.get(k, "") for k in attrs]
            )


def write_plots(study: optuna.Study, folder: Path) -> list[str]:
    """Optuna's optimisation history and parameter importances as PNG files (importances need two
    complete trials). The importances are PED-ANOVA's, which needs only NumPy: Optuna's default,
    fANOVA, needs scikit-learn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as plots

    written = []
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    importances = functools.partial(plots.plot_param_importances, evaluator=PedAnovaImportanceEvaluator())
    for name, plot, needs in (
        ("history.png", plots.plot_optimization_history, 1),
        ("importance.png", importances, 2),
    ):
        if len(complete) < needs:
            continue
        try:
            axes = plot(study)
        except (RuntimeError, ValueError) as error:  # e.g. no variance: every complete trial alike
            print(f"{name} not drawn: {error}")
            continue
        axes.figure.savefig(folder / name, dpi=120, bbox_inches="tight")
        plt.close(axes.figure)
        written.append(name)
    return written


DESCRIPTION = (
    "Run an Optuna sweep: each trial is a `python -m proj fit` with the trial's values as flags. "
    "Start the same command again, here or on other machines (with --storage), to add workers or "
    "to resume."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The sweep's options, on ``parser``: also the CLI's, whose ``--help`` lists ``sweep``."""
    parser.add_argument(
        "--config", required=True, help="the sweep config, e.g. configs/sweeps/digits_optuna.yaml"
    )
    parser.add_argument(
        "--storage",
        help="the study's database URL (default: SQLite in runs/sweeps/<name>/study.db); "
        "e.g. postgresql://user@host/db for workers on several machines",
    )
    parser.add_argument("--n_trials", type=int, help="trials to finish, overriding the config's n_trials")
    return parser


def main(argv: Sequence[str] | None = None) -> optuna.Study:
    """``python -m proj sweep --config SWEEP.yaml [--storage URL] [--n_trials N]``."""
    parser = argparse.ArgumentParser(prog="python -m proj sweep", description=DESCRIPTION)
    parser = add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.config)
        if args.n_trials is not None and args.n_trials < 1:
            raise SweepConfigError(f"--n_trials {args.n_trials}: give a positive number of trials")
        preloaded.start_server()
        sweep.folder.mkdir(parents=True, exist_ok=True)
        storage_url = args.storage or default_storage(sweep)
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # this module prints one line per trial
        started = time.monotonic()
        shown = shown_url(storage_url)
        print(f"Sweep '{sweep.name}': study in {shown}, trials under {sweep.folder}/", flush=True)
        study = run_worker(sweep, storage_url, args.n_trials or sweep.n_trials)
    except SweepConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("Interrupted: the running trial is marked failed. Start the same command again to continue.")
        raise SystemExit(130) from None
    if writes_results(study):
        write_results(study, sweep, started)
    else:
        print(
            f"Sweep '{sweep.name}': this worker is done ({time.monotonic() - started:.0f} s); the worker "
            "that finishes the last trial writes trials.csv and the plots."
        )
    return study

"""The study's database: opened with heartbeats, refused in one line when it cannot be, and a dead
worker's trials failed for a retry."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import Engine, make_url

from projkit.credentials import masked
from projkit.sweep.config import Sweep, SweepConfigError, build_pruner, build_sampler
from projkit.sweep.workers import local_pid, process_alive

# A worker's heartbeat, written while its trial runs: another machine's worker fails a trial whose
# heartbeat is older than the grace period (its worker died or lost the network).
HEARTBEAT_INTERVAL_S = 20


GRACE_PERIOD_S = 90

# The packages of a study's database layer: an error raised with one of them on its way up came
# from the storage, whatever its type (a driver's TypeError, a missing driver's ImportError).
STORAGE_PACKAGES = ("sqlalchemy", "alembic", "sqlite3", "psycopg", "MySQLdb", "pymysql", "optuna.storages")
# The package to install for a driver SQLAlchemy could not import, where the names differ.
DRIVER_PACKAGES = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "psycopg": "psycopg[binary]"}


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
    name, shown = make_url(url).database, masked(url)
    if not name or name == ":memory:" or "mode=memory" in url:
        raise SweepConfigError(
            f"--storage {shown}: an SQLite database in memory lives in this worker alone, and the trials "
            "run in processes of their own. Give a file, e.g. sqlite:///runs/sweeps/study.db"
        )
    path = Path(name)
    if not path.parent.is_dir():
        raise SweepConfigError(
            f"--storage {shown}: the folder {path.parent}/ does not exist, so SQLite cannot create "
            f"{path.name} there. Create the folder, or give a path in an existing one."
        )
    if path.is_dir():
        raise SweepConfigError(
            f"--storage {shown}: {path} is a folder, not an SQLite file. Name a file in it."
        )
    try:
        with open(path, "rb") as file:
            head = file.read(16)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SweepConfigError(
            f"--storage {shown}: cannot read {path} ({error.strerror}). Check its permissions."
        ) from None
    if head and head != b"SQLite format 3\0":
        raise SweepConfigError(
            f"{path}: not an SQLite database, so it holds no study (overwritten or another file?). Move "
            "it aside to start the study afresh, or pass --storage with the study's real database."
        )


def shown_url(url: str) -> str:
    """``url`` as logs may show it: without its password, in its user part or its query
    (``?password=``, which libpq and MySQL's drivers read too)."""
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError:
        raise SweepConfigError(
            f"--storage {masked(url)}: not a database URL. Give an SQLAlchemy URL, e.g. "
            "sqlite:///runs/sweeps/study.db or postgresql://user@host/db."
        ) from None
    return masked(url)


def from_storage(error: BaseException) -> bool:
    """Whether ``error`` came from the study's database: one of SQLAlchemy's or Optuna's storage
    errors, or any error raised with the database layer on its way up."""
    from sqlalchemy.exc import SQLAlchemyError

    if isinstance(error, (SQLAlchemyError, optuna.exceptions.StorageInternalError)):
        return True
    frame = error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__", "").startswith(STORAGE_PACKAGES):
            return True
        frame = frame.tb_next
    return False


def causes(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from (Optuna re-raises a driver's ImportError as its own)."""
    chain = [error]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and cause not in chain:
        chain.append(cause)
    return chain


def storage_refused(url: str, error: BaseException) -> SweepConfigError:
    """The one line for an error of the study's database, when opening it or later in the sweep: the
    URL (without its password), what failed, and the fix where it is known."""
    shown = shown_url(url)
    if missing := next((e.name for e in causes(error) if isinstance(e, ImportError) and e.name), None):
        package = DRIVER_PACKAGES.get(missing, missing)
        return SweepConfigError(
            f"--storage {shown}: its database driver, the Python package '{missing}', is not "
            f"installed. Install it (`uv add {package}`), or name an installed driver in the URL "
            "(e.g. postgresql+psycopg://)."
        )
    reason = masked(str(getattr(error, "orig", None) or error).splitlines()[0]) if str(error) else ""
    fix = (
        "A PostgreSQL database made as SQL_ASCII (initdb in a shell without LANG) holds text the "
        "driver cannot read: make it UTF-8 (`createdb -E UTF8 -T template0 <name>`)."
        if isinstance(error, TypeError) and "bytes-like" in reason and url.startswith("postgres")
        else "Give an SQLAlchemy URL that works here, e.g. sqlite:///runs/sweeps/study.db or "
        "postgresql://user@host/db."
    )
    kind = type(getattr(error, "orig", None) or error).__name__
    return SweepConfigError(f"--storage {shown}: the study's database failed ({kind}: {reason}). {fix}")


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
        study = optuna.create_study(
            storage=storage,
            study_name=sweep.name,
            direction=sweep.direction,
            sampler=build_sampler(sweep),
            pruner=build_pruner(sweep.pruner, str(sweep.path)),
        )
        study.set_user_attr("metric", sweep.metric)
        study.set_user_attr("space", space_json(sweep))
        return study
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
    check_same_study(study, sweep)
    return study


def space_json(sweep: Sweep) -> dict[str, str]:
    return {key: distribution_to_json(d) for key, d in sweep.space.items()}


def check_same_study(study: optuna.Study, sweep: Sweep) -> None:
    """A study is joined only by a sweep of its metric and search space: two sweep configs of one
    file name (the study's name) would otherwise mix their trials in one study."""
    rename = (
        "Rename one of the sweep configs (the study takes its file name), or give this one another --storage"
    )
    metric = study.user_attrs.get("metric")
    if metric is not None and metric != sweep.metric:
        raise SweepConfigError(
            f"{sweep.path}: metric: the study '{sweep.name}' in the storage was made for the metric "
            f"{metric}, not {sweep.metric}. {rename}."
        )
    space, ours = study.user_attrs.get("space"), space_json(sweep)
    if space is not None and (differs := sorted(k for k in {*space, *ours} if space.get(k) != ours.get(k))):
        raise SweepConfigError(
            f"{sweep.path}: space: the study '{sweep.name}' in the storage was made for a search space "
            f"that differs at {differs[0]}. {rename}."
        )


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

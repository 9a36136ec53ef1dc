"""The pytest fixtures a project's tests and the kit's share; a conftest.py imports those it wants
(``from projkit.testing.fixtures import debug, workdir``), which makes them its own.

- ``debug`` (autouse where imported): in-process commands raise a user error as it was raised.
- ``workdir``: the test runs in an empty folder of its own, where runs/ and data/ land.
- ``lightning_logs_to_the_session`` (autouse, session): Lightning's log handler on the session's
  standard error, not on the first test's captured one.

``one_thread_per_worker()`` is for the top of a conftest.py, before torch is imported, and
``longest_first(items, names)`` for its ``pytest_collection_modifyitems``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest


def one_thread_per_worker() -> None:
    """Under pytest-xdist each core runs a worker: one thread per process, set before torch is
    imported and inherited by the training processes tests start, keeps them from oversubscribing
    the machine (two workers of eight threads each on two cores run slower than one)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def longest_first(items: list[pytest.Item], names: Iterable[str]) -> None:
    """Put the test files ``names`` first: ``--dist loadfile`` deals files in collection order, so the
    short files fill the other workers beside the long ones rather than one worker finishing alone."""
    first = set(names)
    items.sort(key=lambda item: item.path.name not in first)


@pytest.fixture(autouse=True)
def debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process commands raise a user error as it was raised (``PROJ_DEBUG=1``), so a test can
    catch its type; the bad-input tests turn it off to see what a user sees."""
    monkeypatch.setenv("PROJ_DEBUG", "1")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so runs/ and data/ land there and nothing of the checkout's is read
    or written by mistake."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session", autouse=True)
def lightning_logs_to_the_session() -> None:
    """Lightning gives its loggers a handler on ``sys.stderr`` as it is when Lightning is first
    imported: imported here, before any test, it writes to the session's stream, not to the ``capsys``
    of the first test that runs a command, which closes with that test (a later test's ``stderr``
    then holds a ``--- Logging error ---`` traceback; test files run alone met it)."""
    import lightning.pytorch  # noqa: F401

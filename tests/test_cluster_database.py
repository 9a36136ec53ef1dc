"""`make cluster`'s database server as `kit/scripts/cluster.sh` makes it (PostgreSQL, installed as the
cluster tests need it; Slurm is not needed here)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_the_database_server_is_utf8_when_started_without_a_locale(tmp_path):
    """`make cluster` from a shell without LANG (cron, `env -i`, a bare container) made SQL_ASCII
    databases, whose text SQLAlchemy's driver returns as bytes: a sweep on them failed with a
    traceback inside SQLAlchemy. A server of its own on another port, started as such a shell would."""
    checkout = tmp_path / "checkout"
    (checkout / "kit" / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "kit" / "scripts" / "cluster.sh", checkout / "kit" / "scripts")
    script = "kit/scripts/cluster.sh"
    bare = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PG_PORT": "15439"}
    started = subprocess.run(
        ["bash", script, "postgres"], cwd=checkout, env=bare, capture_output=True, text=True
    )
    try:
        assert started.returncode == 0, started.stderr
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:15439/postgres") as connection:
            rows = connection.execute(
                "SELECT datname, pg_encoding_to_char(encoding) FROM pg_database"
            ).fetchall()
        assert dict(rows) == {name: "UTF8" for name in ("postgres", "sweeps", "template0", "template1")}
    finally:
        subprocess.run(["bash", script, "stop"], cwd=checkout, env=bare, capture_output=True)

"""A password in a sweep's storage URL (``user:password@``, ``?password=``), shown masked wherever the
sweep prints it: as it starts and in each refusal of the URL. The two-worker sweep of test_sweep.py
runs with one in its URL and checks that no output or file holds it."""

from __future__ import annotations

import pytest

from test_sweep import SECRET, write_sweep


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+nosuchdriver://ann:{SECRET}@127.0.0.1/sweeps?password={SECRET}",  # at start, refused
        f"ann:{SECRET}@db.example.com/sweeps",  # no database URL
        f"sqlite://?password={SECRET}",  # in memory
        f"sqlite:////no-such-folder/study.db?password={SECRET}",
    ],
)
def test_a_password_in_the_storage_url_is_masked_in_what_the_sweep_prints(url, workdir, capsys):
    """Each is refused in one line that shows the URL with its password masked, and nothing is
    written."""
    from projkit.sweep import main as sweep

    with pytest.raises(SystemExit) as exit_info:
        sweep(["--config", str(write_sweep(workdir / "secret.yaml")), "--storage", url])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "***" in lines[0], err
    assert SECRET not in out + err, out + err
    files = [path for path in workdir.rglob("*") if path.is_file()]
    assert not [path for path in files if SECRET.encode() in path.read_bytes()]
    assert not (workdir / "runs").exists()

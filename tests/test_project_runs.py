"""What this project ships around the kit's runs: the README's environment, the character GPT's
samples in a short run and kit/scripts/torchrun.sh (the debug overlays' effects: test_configs.py,
test_debug.py). (The run directories, resumes, preemption, divergence and DDP themselves are the
kit's: kit/tests/.)"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from projkit.testing import config, fit, free_port

from conftest import ROOT, small_gpt


def steps_of(run: Path, name: str) -> list[int]:
    with open(run / "metrics.csv", newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(name)]


@pytest.mark.slow
def test_the_readme_environment_works_in_a_fresh_shell(workdir):
    """After `make install` (or `make train`), the README's `source .venv/bin/activate` is all a new
    shell needs for `python -m proj`."""
    activate = ROOT / ".venv" / "bin" / "activate"
    if not activate.is_file():
        pytest.skip("the environment is not the repository's .venv")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    command = f"python -m proj fit --config {config('digits.yaml')} --print_config"
    script = f"source {activate} && {command}"
    result = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "class_path: proj.models.ImageClassifier" in result.stdout


@pytest.mark.slow
def test_a_short_language_model_run_validates_samples_and_schedules_to_its_end(workdir):
    extra = small_gpt(
        "--trainer.max_steps=20",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
        "--model.init_args.sample_tokens=10",
        "--trainer.enable_progress_bar=false",
    )
    fit("shakespeare_char_cpu.yaml", extra=extra)
    run = workdir / "runs" / "shakespeare_char_cpu" / "version_0"
    assert steps_of(run, "val/loss") == [19], "validated at its last step, not only at 250"
    assert any(p.name.startswith("step00020-loss") for p in (run / "checkpoints").iterdir()), "a best"
    assert "--- step 20, sample 0 ---" in (run / "samples.txt").read_text()
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["lr_schedulers"][0]["total_steps"] == 20


@pytest.mark.slow
def test_two_torchrun_nodes_train_as_one_job(workdir):
    """kit/scripts/torchrun.sh launched twice as on two machines (here both on 127.0.0.1, sharing the run
    folder as a cluster's shared file system would), one process each."""
    # 1,251 training samples: 10 batches of 64 per node.
    fit = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.max_epochs=1",
           "--trainer.enable_progress_bar=false", "--test_after_fit=false",
           "--data.init_args.val_fraction=0.13"]  # fmt: skip
    cluster = {
        "NNODES": "2",
        "NPROC_PER_NODE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    nodes = [
        subprocess.Popen(
            ["bash", str(ROOT / "kit" / "scripts" / "torchrun.sh"), config("digits.yaml"), *fit],
            cwd=workdir,
            env={**os.environ, **cluster, "NODE_RANK": str(rank), "PYTHON": sys.executable},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    assert "Starting with 2 processes" in outputs[0]
    last = torch.load(workdir / "runs/digits/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 10, "each node trained on half of the epoch"

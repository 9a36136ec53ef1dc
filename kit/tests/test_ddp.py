"""Data-parallel training as real separate processes on CPU (gloo): the run directory, synced
metrics, gradients equal to one big batch, exact resume after a kill, and a two-node torchrun job."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import main
from projkit.testing import config, kill_at, launch, step_checkpoints

DDP = ("--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2")
# 325 images: validation and test splits of 49 samples, odd, so shards are uneven and a sampler that
# pads them would count a sample twice. 227 training samples: 8 batches of 16 per rank (the last of 2).
ODD_SPLITS = ("--data.init_args.samples=325",)
QUICK = ("--trainer.max_epochs=2", "--trainer.enable_progress_bar=false", *ODD_SPLITS)
STEPS_PER_EPOCH = 8
PERIODIC = "trainer:\n  callbacks+:" + step_checkpoints(4)

PROBE = """
trainer:
  callbacks+:
    - class_path: probes.SaveGradients
      init_args:
        folder: {}
"""


def ddp_fit(
    workdir: Path, *extra: str, overlay: str = PERIODIC, timeout: float = 300
) -> subprocess.CompletedProcess:
    (workdir / "overlay.yaml").write_text(overlay)
    args = ["fit", "--config", config("classify.yaml"), *DDP, "--config", str(workdir / "overlay.yaml"),
            *QUICK, *extra]  # fmt: skip
    # A session of its own: a kill of the process group reaches the ranks and nothing else.
    return launch.run(args, workdir, timeout=timeout, session=True)


def last_logged(run: Path, *names: str) -> dict[str, float]:
    """The last value metrics.csv holds for each name."""
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {name: float([row[name] for row in rows if row.get(name)][-1]) for name in names}


def states_equal(a: Path, b: Path) -> None:
    expected = torch.load(a, weights_only=True)["state_dict"]
    got = torch.load(b, weights_only=True)["state_dict"]
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"{key} differs"


# Each rank's host reads of device values and collectives in its ordinary steps, as JSON.
COUNTER = """
    - class_path: projkit.testing.SyncCounter
      init_args:
        path: {}/ordinary-steps-rank{{rank}}.json
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A 2-rank run of two epochs, never interrupted, ending with a test of its best checkpoint."""
    workdir = tmp_path_factory.mktemp("ddp-reference")
    result = ddp_fit(workdir, "--test_after_fit=true", overlay=PERIODIC + COUNTER.format(workdir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_one_run_directory_one_config_checkpoints_written_once(reference):
    runs = reference / "runs" / "classify"
    assert [p.name for p in runs.iterdir()] == ["version_0"], "both ranks share one run directory"
    run = runs / "version_0"
    assert (run / "config.yaml").is_file()
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock",
        ".tested_step",
        "checkpoints",
        "config.yaml",
        "hparams.yaml",
        "metrics.csv",
    ]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "last.ckpt" in checkpoints and not any(".tmp" in name for name in checkpoints)
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 2 * STEPS_PER_EPOCH, "each rank trained on its half of every batch"
    with open(run / "metrics.csv", newline="") as f:
        steps = [row["step"] for row in csv.DictReader(f) if row.get("train/loss")]
    assert len(steps) == len(set(steps)), "only rank 0 logs"


@pytest.mark.slow
def test_an_ordinary_ddp_step_neither_syncs_nor_communicates(reference):
    """DDP's gradient all-reduce runs in its C++ reducer and is not counted; a collective that the
    kit or Lightning adds from Python is (Lightning broadcast its SIGTERM flag on every step, and
    Preemption all-reduced its own)."""
    for rank in (0, 1):
        windows = json.loads((reference / f"ordinary-steps-rank{rank}.json").read_text())
        assert len(windows) >= 5, windows
        events = [f"batch {b}: {e['what']} at {e['where']}" for b, es in windows.items() for e in es]
        assert not events, f"rank {rank}, in its ordinary steps:\n" + "\n".join(events)


@pytest.mark.slow
def test_ddp_metrics_equal_a_single_process_evaluation_of_the_same_checkpoint(reference, workdir):
    run = reference / "runs" / "classify" / "version_0"
    logged = last_logged(run, "val/loss", "val/acc", "test/loss", "test/acc")
    # The last validation ran on the final weights, which last.ckpt holds; test_after_fit tested the best.
    checkpoints = run / "checkpoints"
    best = next(p for p in checkpoints.iterdir() if not p.name.startswith(("last", "step")))
    single = ("--config", config("classify.yaml"), *ODD_SPLITS, "--trainer.enable_progress_bar=false")
    validated = main(["validate", *single, f"--ckpt_path={checkpoints / 'last.ckpt'}"])
    assert len(validated.datamodule.splits["val"]) == 49
    tested = main(["test", *single, f"--ckpt_path={best}"])
    assert len(tested.datamodule.splits["test"]) == 49
    metrics = {**validated.trainer.callback_metrics, **tested.trainer.callback_metrics}
    for name, value in logged.items():
        assert metrics[name].item() == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_one_ddp_step_has_the_gradients_of_one_step_on_the_concatenated_batch(workdir):
    # No dropout, augmentation or BatchNorm: the two processes' batches then make exactly one big batch.
    exact = ("--model.init_args.net.init_args.dropout=0.0", "--data.init_args.augment=false",
             "--trainer.max_steps=1", "--test_after_fit=false")  # fmt: skip
    probe = PROBE
    result = ddp_fit(workdir, *exact, overlay=probe.format(workdir / "ddp"))
    assert result.returncode == 0, result.stderr[-3000:]

    (workdir / "single.yaml").write_text(probe.format(workdir / "single"))
    main(["fit", "--config", config("classify.yaml"), "--config", str(workdir / "single.yaml"), *QUICK,
          *exact, "--data.init_args.batch_size=32"])  # fmt: skip

    single = torch.load(workdir / "single" / "rank0.pt", weights_only=True)
    ranks = [torch.load(workdir / "ddp" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name, grad in single["grads"].items():
        assert torch.equal(ranks[0]["grads"][name], ranks[1]["grads"][name]), f"{name}: ranks disagree"
        for rank in ranks:
            assert torch.equal(rank["weights"][name], single["weights"][name]), f"{name}: different start"
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_ddp_run_killed_mid_epoch_resumes_bit_identical_on_every_rank(reference, workdir):
    kill_step = STEPS_PER_EPOCH + 5  # epoch 1, batch 5; the newest checkpoint is step0012.ckpt
    killed = ddp_fit(workdir, "--test_after_fit=false", overlay=PERIODIC + kill_at(kill_step, group=True))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(workdir / "runs/classify/version_0/checkpoints/step0012.ckpt", weights_only=True)
    assert saved["global_step"] == 12

    # One process cannot continue the two processes' shards of the epoch: refused with the flag.
    with pytest.raises(ValueError, match=r"run of 2 process\(es\), and this run has 1.*--trainer.devices=2"):
        main(["fit", "--config", config("classify.yaml"), *QUICK, "--test_after_fit=false",
              "--ckpt_path=last"])  # fmt: skip
    resumed = ddp_fit(workdir, "--test_after_fit=false", "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in (workdir / "runs" / "classify").iterdir()] == ["version_0"]
    states_equal(
        reference / "runs/classify/version_0/checkpoints/last.ckpt",
        workdir / "runs/classify/version_0/checkpoints/last.ckpt",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*launcher: str) -> list[str]:
    """``python -m tinyproj fit`` under torch's launcher (what a project's torchrun script runs): DDP on
    CPU, ``launcher`` its options, each node's processes as many as its ``--nproc-per-node``."""
    return [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "tinyproj", "fit", "--config",
            config("classify.yaml"), "--trainer.strategy=ddp", "--trainer.accelerator=cpu"]  # fmt: skip


@pytest.mark.slow
def test_two_torchrun_nodes_train_as_one_job(workdir):
    """torchrun launched twice as on two machines (here both on 127.0.0.1, sharing the run folder as
    a cluster's shared file system would), one process each."""
    fit = ["--trainer.devices=1", "--trainer.num_nodes=2", "--trainer.max_epochs=1",
           "--trainer.enable_progress_bar=false", "--test_after_fit=false", *ODD_SPLITS]  # fmt: skip
    rendezvous = ("--nnodes=2", "--nproc-per-node=1", "--master-addr=127.0.0.1",
                  f"--master-port={free_port()}")  # fmt: skip
    nodes = [
        subprocess.Popen(
            [*torchrun(*rendezvous, f"--node-rank={rank}"), *fit],
            cwd=workdir,
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
    last = torch.load(workdir / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == STEPS_PER_EPOCH, "each node trained on half of the epoch"


@pytest.mark.slow
def test_a_rank_killed_outright_stops_the_other_with_the_resume_command(workdir):
    killed = ddp_fit(workdir, "--test_after_fit=false", overlay=PERIODIC + kill_at(6, rank=1))
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "error: another process of this distributed job stopped" in killed.stderr
    assert "--ckpt_path last" in killed.stderr and "Traceback" not in killed.stderr
    saved = torch.load(workdir / "runs/classify/version_0/checkpoints/step0004.ckpt", weights_only=True)
    assert saved["global_step"] == 4, "the checkpoint before the loss is intact"


def children(parent: int) -> list[int]:
    """The processes alive whose parent is ``parent`` (torchrun starts each worker in a session of
    its own, so only the parentage ties them to their agent)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if int(ppid) == parent and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_workers_stop_and_save_when_their_torchrun_agent_is_killed(workdir):
    started = workdir / "started"
    overlay = workdir / "overlay.yaml"
    overlay.write_text(
        "trainer:\n  callbacks+:\n    - class_path: faults.TouchAtStep\n"
        f"      init_args:\n        step: 3\n        path: {started}\n"
    )
    fit = ["--trainer.devices=2", "--trainer.max_epochs=100", "--trainer.enable_progress_bar=false",
           "--config", str(overlay)]  # fmt: skip
    with open(workdir / "log.txt", "w") as log:
        agent = subprocess.Popen(
            [*torchrun("--standalone", "--nproc-per-node=2"), *fit],
            cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    workers: list[int] = []
    try:
        for _ in range(300):
            if started.exists() or agent.poll() is not None:
                break
            time.sleep(0.5)
        assert started.exists(), (workdir / "log.txt").read_text()[-3000:]
        workers = children(agent.pid)
        assert len(workers) == 2
        os.kill(agent.pid, signal.SIGKILL)  # the agent only: its workers are orphaned
        agent.wait()
        for _ in range(120):
            if not any(alive(pid) for pid in workers):
                break
            time.sleep(0.5)
        assert not any(alive(pid) for pid in workers), "the workers trained on without their launcher"
    finally:
        for pid in [agent.pid, *workers, *children(agent.pid)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    log = (workdir / "log.txt").read_text()
    assert "Received SIGTERM at step" in log, log[-3000:]
    saved = torch.load(workdir / "runs/classify/version_0/checkpoints/last.ckpt", weights_only=True)
    assert saved["global_step"] >= 3


RECORDER = """
    - class_path: probes.RecordSamples
      init_args:
        folder: {}
"""


def samples(folder: Path, epoch: int, before_step: int | None = None, after_step: int = -1) -> Counter:
    """Each sample the ranks recorded in ``folder`` in ``epoch`` (at steps in the range), counted."""
    seen = Counter()
    for path in folder.glob("rank*.txt"):
        for line in path.read_text().splitlines():
            e, step, digest = line.split()
            if int(e) == epoch and after_step < int(step) < (before_step or 2**31):
                seen[digest] += 1
    return seen


@pytest.mark.slow
def test_a_streamed_ddp_run_resumes_bit_identical_and_on_one_process_loses_and_repeats_no_sample(workdir):
    chunks = workdir / "chunks"
    main(["optimize", "--config", config("classify.yaml"), *ODD_SPLITS, f"--output={chunks}"])
    data = (
        f"--data.init_args.stream_from={chunks}",
        "--data.init_args.augment=false",
        "--data.init_args.num_workers=2",
    )
    reference = workdir / "reference"
    reference.mkdir()
    done = ddp_fit(
        reference, "--test_after_fit=false", *data, overlay=PERIODIC + RECORDER.format(reference / "seen")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = len(samples(reference / "seen", 0)) // 32 + 1  # batches of 16 per rank

    killed = workdir / "killed"
    killed.mkdir()
    kill_step = steps + 5  # epoch 1, mid-way; its newest checkpoint is a step checkpoint before
    overlay = PERIODIC + kill_at(kill_step, group=True) + RECORDER.format(killed / "seen")
    result = ddp_fit(killed, "--test_after_fit=false", *data, overlay=overlay)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    resumed = ddp_fit(killed, "--test_after_fit=false", *data, "--ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    states_equal(
        reference / "runs/classify/version_0/checkpoints/last.ckpt",
        killed / "runs/classify/version_0/checkpoints/last.ckpt",
    )

    # The same kill, resumed by one process: the epoch's samples each once, none lost, and it says so.
    checkpoint = max(
        (p for p in (killed / "runs/classify/version_0/checkpoints").glob("step*.ckpt")),
        key=lambda p: torch.load(p, weights_only=True)["global_step"] if p.stat().st_size else -1,
    )
    saved_step = torch.load(checkpoint, weights_only=True)["global_step"]
    (killed / "seen").rename(killed / "seen-before")
    (workdir / "recorder.yaml").write_text("trainer:\n  callbacks+:" + RECORDER.format(killed / "seen-one"))
    args = ["fit", "--config", config("classify.yaml"), "--config", str(workdir / "recorder.yaml"), *QUICK,
            *data, "--test_after_fit=false", f"--ckpt_path={checkpoint}"]  # fmt: skip
    one = launch.run(args, killed, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "Resuming mid-epoch with 1 process(es) where the checkpoint had 2" in one.stdout + one.stderr
    before = samples(killed / "seen-before", 1, before_step=saved_step)
    after = samples(killed / "seen-one", 1)
    whole = samples(reference / "seen", 1)
    assert not (before & after), f"{len(before & after)} samples read again after the resume"
    assert before + after == whole, f"lost {len(whole - before - after)}, added {len(before + after - whole)}"

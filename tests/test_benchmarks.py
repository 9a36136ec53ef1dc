"""The kit's benchmarks (kit/benchmarks/) on this project's own experiments, where the kit's tests
(kit/tests/test_benchmarks.py, on tinyproj) cannot reach: MNIST's torchvision files written
synthetically when absent, the GPT's activation checkpointing, and every stage of the GPU proof,
which runs the checkout's configs. Tiny step counts, so they do not rot; the figures themselves
are not asserted (timings on a shared machine mean little)."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from conftest import CORPUS, ROOT


@pytest.fixture
def benchmark(workdir, monkeypatch):
    """Import a benchmark script as a module, the way it imports its neighbours when run; the
    torch threads it sets (``--threads``) are restored afterwards."""
    monkeypatch.syspath_prepend(str(ROOT / "kit" / "benchmarks"))
    threads = torch.get_num_threads()
    yield importlib.import_module
    torch.set_num_threads(threads)


def last_ratio(capsys: pytest.CaptureFixture) -> float:
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("ratio "), last
    return float(last.split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["mnist"])
def test_dataloading_benchmark(experiment, benchmark, capsys):
    args = [
        "--experiment",
        experiment,
        "--seconds=0.01",
        "--rounds=1",
        "--warmup=1",
        f"--corpus={CORPUS}",
    ]
    benchmark("dataloading").main_benchmark(args)
    output = capsys.readouterr().out
    assert ("SYNTHETIC" in output) == (experiment == "mnist")  # no MNIST files in the test's folder
    found = re.search(
        rf"^{experiment}: data path ([\d,.]+) batches/s, training step ([\d,.e+]+) batches/s, "
        r"ratio ([\d,.]+)",
        output,
        re.M,
    )
    assert found, output
    delivered, used, ratio = (float(figure.replace(",", "")) for figure in found.groups())
    assert delivered > 0 and used > 0
    # The ratio is the two printed rates' (to the rounding of three significant digits).
    assert ratio == pytest.approx(delivered / used, rel=0.01, abs=0.06)
    assert output.strip().splitlines()[-1] == f"ratio {ratio:.1f} (lowest, {experiment})"


@pytest.mark.slow
def test_memory_benchmark(benchmark, capsys, workdir):
    text = workdir / "verse.txt"
    text.write_text("Shall I compare thee to a summer's day?\n" * 40, encoding="utf-8")
    small = ["--model.init_args.net.init_args.n_layer=2", "--data.init_args.batch_size=2"]
    benchmark("memory").main_benchmark(
        ["--experiment=shakespeare_char_cpu", f"--corpus={text}", "--", *small]
    )
    assert 0 < last_ratio(capsys) < 1  # checkpointing saves memory


@pytest.mark.slow
def test_gpu_proof_smoke_runs_every_stage_and_writes_where_it_is_told(benchmark, capsys, workdir):
    # Every stage of kit/benchmarks/gpu_proof.py for a few CPU steps, so the script a lent GPU runs
    # works when one comes; the repository's RESULTS.md (a GPU's figures) is left alone.
    shipped = ROOT / "kit" / "benchmarks" / "RESULTS.md"
    before = shipped.read_bytes() if shipped.exists() else None
    results = workdir / "results" / "RESULTS.md"
    assert benchmark("gpu_proof").main(["--smoke", f"--results={results}"]) == 0
    text = results.read_text()
    for stage in ("environment", "digits", "fp16_scaler", "shakespeare_char", "gpt2_small"):
        assert f"\n## {stage}: " in text
    assert "all passed" in text and "FAILED" not in text
    # The 16-mixed run went through the gradient scaler, every step checked and clipped.
    assert "steps checked: unscaled before clipping: 8 of 8 (8 clipped" in text
    assert "train/grad_scale logged: 8 times" in text
    assert "proj / plain_fit.py" in text and "with activation checkpointing" in text
    assert (shipped.read_bytes() if shipped.exists() else None) == before
    assert capsys.readouterr().out.strip().endswith(f"results: {results}")

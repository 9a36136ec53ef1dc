"""The benchmarks (kit/benchmarks/) run end to end on tinyproj's experiments with tiny step counts,
so they do not rot, and report honestly: both sides did the same work and the printed figures add up.
The figures themselves are not asserted (timings on a shared machine mean little). The template's
tests/test_benchmarks.py runs the ones that need its own experiments (MNIST files, the GPT's
activation checkpointing, the GPU proof's smoke)."""

from __future__ import annotations

import importlib
import itertools
import re
import statistics

import pytest
import torch

from conftest import KIT
from projkit.testing import config


@pytest.fixture
def benchmark(workdir, monkeypatch):
    """Import a benchmark script as a module, the way it imports its neighbours when run; the
    torch threads it sets (``--threads``) are restored afterwards. An experiment is passed as the
    path of a tinyproj config, so the benchmarks run tinyproj's commands."""
    monkeypatch.syspath_prepend(str(KIT / "benchmarks"))
    threads = torch.get_num_threads()
    yield importlib.import_module
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize(("experiment", "steps"), [("classify", 20), ("lm", 5)])
def test_overhead_benchmark(experiment, steps, benchmark, capsys):
    # The classify run must reach its first validation: early stopping reads val/loss at an epoch's end.
    args = [
        "--experiment",
        config(f"{experiment}.yaml"),
        f"--steps={steps}",
        "--warmup=1",
        "--rounds=1",
        "--threads=1",
        "--clock=cpu",
        # The per-callback table once (a fit more): the classify run prints it, the lm run none.
        "--per-callback=throughput" if experiment == "classify" else "--per-callback=none",
    ]
    benchmark("overhead").main_benchmark(args)
    output = capsys.readouterr().out
    rates = {
        name: float(rate) for name, rate in re.findall(r"^  (\S+(?: \S+)?) +steps/s ([\d.]+)", output, re.M)
    }
    assert set(rates) == {"plain loop", "tinyproj fit", "bare Trainer"}, output
    assert all(rate > 0 for rate in rates.values()), output
    floor, added = map(
        float, re.search(r"plain loop ([\d.]+); tinyproj fit / bare Trainer ([\d.]+)", output).groups()
    )
    ratio = float(re.search(rf"{experiment} ratio ([\d.]+)", output).group(1))
    # Each figure from the printed rates, to their rounding: the ratio is the product of its two parts.
    assert floor == pytest.approx(rates["bare Trainer"] / rates["plain loop"], rel=0.01)
    assert added == pytest.approx(rates["tinyproj fit"] / rates["bare Trainer"], rel=0.01)
    assert ratio == pytest.approx(rates["tinyproj fit"] / rates["plain loop"], rel=0.01)
    assert ratio == pytest.approx(floor * added, rel=0.005)
    table = re.search(r"^    throughput +[+-]\d+\.\d{3} ms a step \( *[+-][\d.]+%\)$", output, re.M)
    assert bool(table) == (experiment == "classify"), output
    assert output.strip().splitlines()[-1] == f"ratio {ratio:.3f} (lowest, {experiment})"


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["classify", "lm"])
def test_dataloading_benchmark(experiment, benchmark, capsys):
    args = ["--experiment", config(f"{experiment}.yaml"), "--seconds=0.01", "--rounds=1", "--warmup=1"]
    benchmark("dataloading").main_benchmark(args)
    output = capsys.readouterr().out
    assert "SYNTHETIC" not in output and "real data" in output  # tinyproj's data is its own
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
def test_end_to_end_benchmark(benchmark, capsys, workdir):
    # Two steps of the text task on a short text, each side once, no start-up measure: both commands
    # run to their final test metric, and what is printed adds up; the figures themselves are not
    # asserted.
    text = workdir / "verse.txt"
    text.write_text("Shall I compare thee to a summer's day?\n" * 100, encoding="utf-8")
    args = [f"--experiment={config('lm.yaml')}", "--steps=2", "--rounds=1", "--startup-rounds=0"]
    ratios = benchmark("end_to_end").main([*args, "--threads=1", "--clock=cpu", f"--corpus={text}"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "2 steps asked, 2 trained by each side in each round, 1 rounds alternating" in lines[1]
    totals = {}
    for line in lines[2:4]:
        side, total, rounds = re.fullmatch(
            r"  (plain script|tinyproj fit) +([\d.]+) \(rounds: ([\d.]+)\)", line
        ).groups()
        totals[side] = float(total)
        # The same time, printed to 0.01 and to 0.1.
        assert float(rounds) == pytest.approx(totals[side], abs=0.055 + 1e-9), "one round: its median"
    # Each moment in one phase: the phases of a side add up to its total (to the printed rounding).
    phases = [line.split() for line in lines[5:13]]
    assert [" ".join(words[:-3]) for words in phases] == list(benchmark("end_to_end").PHASES)
    for column, side in ((-3, "plain script"), (-2, "tinyproj fit")):
        assert sum(float(words[column]) for words in phases) == pytest.approx(totals[side], abs=0.05)
    ratio = ratios["lm"]
    assert ratio == pytest.approx(totals["plain script"] / totals["tinyproj fit"], rel=0.01)
    assert lines[-2] == f"  lm ratio {ratio:.3f} (plain / tinyproj)"
    assert lines[-1] == f"ratio {ratio:.3f} (lm)"


@pytest.mark.slow
def test_sweep_workers_benchmark(benchmark, capsys, workdir):
    # One trial of one epoch each way, once: both settings train the same steps, and the ratio is
    # of the medians of the rounds printed.
    args = [f"--experiment={config('classify.yaml')}", "--workers=1", "--epochs=1", "--rounds=1"]
    times = benchmark("sweep_workers").main(args)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("1 trials at once on ")
    assert lines[1] == f"round 1 (own first): own {times['own'][0]:.1f} s, split {times['split'][0]:.1f} s"
    assert lines[2] == "each trial trained 14 steps"  # an epoch of classify: 224 images in batches of 16
    own, split = statistics.median(times["own"]), statistics.median(times["split"])
    assert lines[3:] == [
        f"median: own {own:.1f} s, split {split:.1f} s",
        f"ratio {own / split:.2f} (own / split)",
    ]


def test_gpu_proof_smoke_needs_a_results_path(benchmark, capsys):
    with pytest.raises(SystemExit) as stopped:
        benchmark("gpu_proof").main(["--smoke"])
    assert stopped.value.code == 2
    assert "--smoke writes its results only where --results says" in capsys.readouterr().err


@pytest.mark.slow
def test_the_gpu_proofs_scaler_check_fails_where_clipping_sees_scaled_gradients(benchmark, workdir):
    """The 16-mixed stage's check is no formality: with a precision plugin that clips before it
    unscales (the bug it looks for), the run stops."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.plugins import MixedPrecision

    from tinyproj.data import Blobs
    from tinyproj.models import Classifier
    from tinyproj.nets import MLP

    class ClipsScaledGradients(MixedPrecision):
        def optimizer_step(self, optimizer, model, closure, **kwargs):
            closure()
            self._after_closure(model, optimizer)  # clipping, before unscale_
            self.scaler.step(optimizer, **kwargs)
            self.scaler.update()

    gpu_proof = benchmark("gpu_proof")
    trainer = Trainer(
        accelerator="cpu",
        plugins=[ClipsScaledGradients(precision="16-mixed", device="cpu")],
        gradient_clip_val=0.1,
        max_steps=2,
        callbacks=[gpu_proof.ScalerCheck()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    model = Classifier(MLP(4, (1, 4, 4)), num_classes=4)
    with pytest.raises(gpu_proof.StageFailed, match="reach clipping READY, not UNSCALED"):
        trainer.fit(model, datamodule=Blobs())


@pytest.mark.slow
def test_image_check_benchmark(benchmark, capsys):
    slowest = benchmark("image_check").main(["--files=20", "--rounds=1"])
    output = capsys.readouterr().out
    assert "png 32:" in output and "jpeg 256:" in output
    assert output.strip().splitlines()[-1] == f"slowest {slowest:.2f} s per 10,000 files" and slowest > 0


@pytest.mark.slow
def test_inference_benchmark(benchmark, capsys):
    args = ["--experiment", config("classify.yaml"), "--seconds=0.01", "--rounds=1", "--threads=1"]
    ratios = benchmark("inference").main_benchmark(args)
    output = capsys.readouterr().out
    for batch in (1, 64):
        for name in ("onnxruntime", "exported", "eager"):
            assert re.search(rf"batch +{batch} +{name} ", output), output
    last = output.strip().splitlines()[-1]
    assert last == f"ratio {ratios['onnxruntime', 64]:.2f} (onnxruntime / eager, batch 64)" and ratios


@pytest.mark.slow
def test_trial_start_benchmark(benchmark, capsys, workdir):
    # One round of a one-epoch trial each way: both end with the same weights (the script stops
    # otherwise), and the ratio is of the medians of the rounds printed.
    times = benchmark("trial_start").main(
        [f"--experiment={config('classify.yaml')}", "--epochs=1", "--rounds=1"]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("server started and answered --help in ")
    new, forked = times["new"][0], times["forked"][0]
    assert lines[1:] == [
        f"round 1 (new first): new {new:.1f} s, forked {forked:.1f} s, the same weights",
        f"median: new {new:.1f} s, forked {forked:.1f} s",
        f"ratio {new / forked:.2f} (new / forked)",
    ]


@pytest.mark.slow
def test_serve_benchmark(benchmark, capsys):
    args = ["--experiment", config("classify.yaml"), "--rounds=1", "--seconds=0.2", "--requests=20"]
    args.append("--larger=none")  # the ResNet's export alone takes longer than the rest
    ratios = benchmark("serve").main_benchmark([*args, "--clients", "1", "4"])
    output = capsys.readouterr().out
    row = r"^ *(\d+) clients  (\S+(?: \S+)?) +([\d,.]+) requests/s .* ([\d.]+)x direct$"
    rows = re.findall(row, output, re.M)
    assert {(int(c), name) for c, name, _, _ in rows} == {
        (c, name) for c in (1, 4) for name in ("direct", "batching", "no batching")
    }, output
    for clients, name, rate, ratio in rows:
        assert float(rate.replace(",", "")) > 0
        assert float(ratio) == pytest.approx(ratios[name, int(clients)], abs=1e-3)
    assert output.strip().splitlines()[-1] == (
        f"ratio {ratios['batching', 4]:.3f} (served with batching / direct onnxruntime, 4 clients)"
    )


@pytest.mark.slow
def test_streaming_benchmark(benchmark, capsys, workdir):
    # 240 images at 1x and 10x, one round, the image folder at 1x only: every path read the same
    # samples in every process (the script stops otherwise), the ratios are those of the printed
    # figures, loader workers are counted where there are some, and the data written is removed.
    # Batches of 25: 200 training images are whole batches for 2 workers, so a streamed epoch (which
    # leaves out a last partial batch) reads them all.
    data = workdir / "data"
    args = ["--images=240", "--scales", "1", "10", "--workers", "0", "2", "--rounds=1", "--folder-cap=200"]
    args.append("--batch=25")
    highest = benchmark("streaming").main([*args, f"--workdir={data}"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("10x: 2,400 images; chunks ") for line in lines), lines
    assert any(
        "NO image folder (2,000 training images > --folder-cap 200): not measured" in ln for ln in lines
    )
    peaks = {}
    for scale, images in ((1, 200), (10, 2000)):
        header = f"{scale}x: {images:,} training images read by each (the whole epoch), medians of 1 rounds:"
        start = lines.index(header) + 1
        section = list(itertools.takewhile(lambda line: line.startswith("  "), lines[start:]))
        rows = streaming_rows(section)
        paths = {("streaming", 0), ("streaming", 2), ("in memory", 0)}
        assert set(rows) == paths | ({("image folder", 0), ("image folder", 2)} if scale == 1 else set())
        for workers in (0, 2):
            shown = next(line for line in section if line.startswith(f"  streaming, {workers} workers: "))
            ratios = re.findall(r"([\d.]+)x (.+?), (\d) workers", shown)
            assert len(ratios) == len(rows) - 2, shown  # one to each path but streaming's
            for ratio, other, other_workers in ratios:
                # Of the rates before they were printed to the unit: within what that rounding allows.
                streaming, path = rows["streaming", workers][0], rows[other, int(other_workers)][0]
                low, high = (streaming - 0.5) / (path + 0.5), (streaming + 0.5) / (path - 0.5)
                assert low - 0.005 <= float(ratio) <= high + 0.005, shown
        peaks[scale] = {workers: rows["streaming", workers][1] for workers in (0, 2)}
    for workers in (0, 2):
        small, large = peaks[1][workers], peaks[10][workers]
        shown = (
            f"peak memory, streaming, {workers} workers: 1x {small:,.1f} MiB, 10x {large:,.1f} MiB, ratio "
        )
        assert any(line.startswith(shown) for line in lines), lines
    assert highest == pytest.approx(max(peaks[10][w] / peaks[1][w] for w in (0, 2)), abs=0.0015)
    assert lines[-1] == f"ratio {highest:.3f} (streaming's peak memory, largest scale / 1x, highest)"
    assert data.is_dir() and not any(data.iterdir())  # what it wrote is gone; the folder given stays


def streaming_rows(section: list[str]) -> dict[tuple[str, int], tuple[float, float]]:
    """Each path's samples/s and peak MiB, as the streaming benchmark prints them; the peak must be
    the process's and its largest worker's, and a worker counted exactly where there are workers."""
    row = r"  (.+?), (\d) workers +([\d,]+) samples/s  peak ([\d,.]+) MiB "
    row += r"\(process ([\d,.]+) \+ largest worker ([\d,.]+);"
    rows = {}
    for line in section:
        if found := re.match(row, line):
            path, workers, *figures = found.groups()
            rate, peak, process, worker = (float(figure.replace(",", "")) for figure in figures)
            assert rate > 0 and peak == pytest.approx(process + worker, abs=0.15), line
            assert (worker > 0) == (int(workers) > 0), line
            rows[path, int(workers)] = (rate, peak)
    return rows

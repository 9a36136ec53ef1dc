"""The documented deploy examples (kit/examples/, as kit/docs/export.md shows them) run as a deployment runs
them and answer as ``predict`` does on every file, for the digits and for an image folder of
non-square files (whose evaluation resizes the shorter side and crops the centre; model.json says
so, and the examples read it from there alone). classify_image.py runs in a virtual environment of
its own that holds only what it imports (numpy, Pillow, onnxruntime), never the template;
predict_pt2.py, which needs torch (gigabytes with its CUDA libraries), in this environment, in a
process that imports neither the template nor Lightning. The same export served (``python -m proj
serve``, asked over real HTTP on 127.0.0.1) answers as ``predict`` does on the same files too."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from PIL import Image
from projkit.callbacks import PredictionFileWriter
from projkit.testing import TINY_FIT, ServedExport, config, write_png

from conftest import ROOT
from proj import main

EXAMPLES = ROOT / "kit" / "examples"
# What classify_image.py imports; the environment gets these and what they depend on, no more.
DEPLOYED = ("numpy", "pillow", "onnxruntime")


def installed_closure(names: tuple[str, ...]) -> dict[str, str]:
    """``names`` and everything they need on this machine (extras followed), with the versions
    installed here: what ``pip install numpy pillow onnxruntime torch`` would bring."""
    versions: dict[str, str] = {}
    todo = [(name, frozenset()) for name in names]
    while todo:
        name, extras = todo.pop()
        dist = importlib.metadata.distribution(name)
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in versions and not extras:
            continue
        versions[key] = dist.version
        for text in dist.requires or []:
            need = Requirement(text)
            wanted = [{"extra": extra} for extra in ("", *extras)]
            if need.marker is None or any(need.marker.evaluate(env) for env in wanted):
                todo.append((need.name, frozenset(need.extras)))
    return versions


def uv() -> str:
    found = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    if not Path(found).exists():
        pytest.fail("no uv: `make install` puts it in .tools/bin/uv")
    return found


@pytest.fixture(scope="module")
def deploy_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a new virtual environment holding only ``DEPLOYED`` (installed from uv's
    cache, offline, at this environment's versions)."""
    venv = tmp_path_factory.mktemp("deploy") / "venv"
    env = {**os.environ, "UV_COMPILE_BYTECODE": "0"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([uv(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    pins = [f"{name}=={version}" for name, version in installed_closure(DEPLOYED).items()]
    python = venv / "bin" / "python"
    done = subprocess.run(
        [uv(), "pip", "install", "-q", "--offline", "--no-deps", "--python", str(python), *pins],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def predicted(args: tuple[str, ...], ckpt: Path, files: Path) -> dict[str, tuple[str, float]]:
    """``predict``'s rows on the folder ``files``: file name -> (class, probability)."""
    cli = main(["predict", *args, f"--ckpt_path={ckpt}", f"--data.init_args.predict_path={files}"])
    (writer,) = [c for c in cli.trainer.callbacks if isinstance(c, PredictionFileWriter)]
    with open(writer.path, newline="") as f:
        return {row["file"]: (row["class"], float(row["probability"])) for row in csv.DictReader(f)}


def fitted_export(args: tuple[str, ...]) -> tuple[Path, Path]:
    """A tiny fit's ``last.ckpt`` and its export (ONNX and torch.export)."""
    fit = main(["fit", *args, *TINY_FIT, "--test_after_fit=false"])
    ckpt = (Path(fit.trainer.checkpoint_callbacks[-1].dirpath) / "last.ckpt").resolve()
    main(["export", *args, f"--ckpt_path={ckpt}"])
    return ckpt, ckpt.parent.parent / "export" / "last"


def run_examples(python: Path | str, runs: list[tuple[str, list[str]]], cwd: Path) -> list[list[str]]:
    """Each example of ``runs`` with its arguments, as written, in ``python``'s environment and one
    process: the lines each printed."""
    driver = f"""
import contextlib, io, json, runpy, sys
sys.path.insert(0, {str(EXAMPLES)!r})
outputs = []
for script, argv in {[(str(EXAMPLES / s), a) for s, a in runs]!r}:
    sys.argv = [script, *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(script, run_name="__main__")
    outputs.append(out.getvalue().splitlines())
assert not [m for m in sys.modules if m.split(".")[0] in ("proj", "projkit", "lightning")]
print(json.dumps(outputs))
"""
    done = subprocess.run([str(python), "-I", "-c", driver], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_examples_agree(python: Path, export: Path, files: list[Path], rows: dict, cwd: Path) -> None:
    assert sorted(rows) == sorted(file.name for file in files)
    single = run_examples(python, [("classify_image.py", [str(export), str(file)]) for file in files], cwd)
    (batch,) = run_examples(sys.executable, [("predict_pt2.py", [str(export), *map(str, files)])], cwd)
    for file, (line,), batch_line in zip(files, single, batch, strict=True):
        name, probability = rows[file.name]
        said_class, said_probability = line.split()
        assert said_class == name, (file.name, line, rows[file.name])
        assert float(said_probability) == pytest.approx(probability, abs=1e-4), file.name
        path, pt2_class, pt2_probability = batch_line.split()
        assert (path, pt2_class) == (str(file), name), batch_line
        assert float(pt2_probability) == pytest.approx(probability, abs=1e-4), file.name


def assert_served_agrees(export: Path, files: list[Path], rows: dict) -> None:
    """The export behind ``python -m proj serve``: each file posted as it is gets ``predict``'s class,
    and its probability within 1e-4."""
    with ServedExport(str(export)) as server:
        for file in files:
            status, answer = server.post(file.read_bytes(), "image/png")
            assert status == 200, (file.name, answer)
            name, probability = rows[file.name]
            assert answer["class"] == name, (file.name, answer, rows[file.name])
            assert answer["probability"] == pytest.approx(probability, abs=1e-4), file.name


def test_the_environment_holds_no_template(deploy_python):
    said = subprocess.run(
        [
            str(deploy_python),
            "-I",
            "-c",
            "import importlib.util as u; print([m for m in "
            "('proj', 'projkit', 'lightning', 'torch', 'onnxruntime') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert said.stdout.strip() == "['onnxruntime']"


@pytest.mark.slow
def test_digits_examples_and_server_agree_with_predict_on_every_file(deploy_python, workdir):
    rng = np.random.default_rng(0)
    files = []
    for index, (width, height) in enumerate([(8, 8), (32, 32), (24, 16), (9, 30), (5, 5)]):
        files.append(workdir / "mine" / f"digit{index}.png")
        write_png(files[-1], rng.integers(0, 256, (height, width)))
    args = ("--config", config("digits.yaml"))
    ckpt, export = fitted_export(args)
    rows = predicted(args, ckpt, workdir / "mine")
    assert_examples_agree(deploy_python, export, files, rows, workdir)
    assert_served_agrees(export, files, rows)


@pytest.mark.slow
def test_image_folder_examples_and_server_agree_with_predict_on_non_square_files(deploy_python, workdir):
    root = workdir / "shapes"
    for index in range(12):
        for label, level in (("bright", 200), ("dark", 40)):
            write_png(root / label / f"{index}.png", np.full((10 + index, 14), level + 3 * index))
    rng = np.random.default_rng(1)
    files = []
    for index, (width, height, mode) in enumerate(
        [(40, 23, "RGB"), (23, 40, "RGB"), (17, 17, "L"), (61, 12, "RGBA"), (9, 31, "RGB")]
    ):
        channels = {"L": (), "RGB": (3,), "RGBA": (4,)}[mode]
        files.append(workdir / "mine" / f"photo{index}.png")
        files[-1].parent.mkdir(exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, *channels), dtype=np.uint8)
        Image.fromarray(pixels, mode).save(files[-1])
    args = (
        "--config",
        config("image_folder.yaml"),
        f"--data.init_args.root={root}",
        "--data.init_args.image_size=12",
        "--data.init_args.num_workers=0",
    )
    ckpt, export = fitted_export(args)
    described = json.loads((export / "model.json").read_text())["preprocessing"]
    assert described["resize"]["shorter_side"] > described["crop"][0] == 12, described
    rows = predicted(args, ckpt, workdir / "mine")
    assert_examples_agree(deploy_python, export, files, rows, workdir)
    assert_served_agrees(export, files, rows)

"""`python -m tinyproj export`: artifacts that compute what their checkpoint computes, on the test
split, for both kinds of deployable (tinyproj's pixel classifier and its token model); the refusals;
and the artifacts used as a deployment uses them, with onnxruntime or torch alone."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

import projkit
from conftest import DEFAULTS, main
from projkit.context import use
from projkit.testing import config
from projkit.testing.export import assert_same_as_checkpoint, export_of, fit_and_export, variant
from test_public_surface import assert_fields_kept
from tinyproj import PROJECT
from tinyproj.data import Blobs, Chars
from tinyproj.models import Classifier, LanguageModel

CLASSIFY = ("--config", config("classify.yaml"))
LM = ("--config", config("lm.yaml"))
BLOCK_SIZE = 16  # lm.yaml's


def classify_test_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The classifier's test split as pixels in [0, 1] and as the model takes it (normalised)."""
    data = Blobs()
    data.setup("test")
    images, labels = data.splits["test"].images, data.splits["test"].labels
    normalised, _ = data.on_after_batch_transfer((images, labels), 0)
    return images.float() / 255, normalised


def lm_windows(reference: LanguageModel) -> torch.Tensor:
    """7 windows of ``BLOCK_SIZE`` token ids from the end of the language model's text."""
    text = Chars().text[-1000:]
    tokens = torch.tensor([reference.vocab.index(c) for c in text])
    return tokens[: 7 * BLOCK_SIZE].view(7, BLOCK_SIZE)


@pytest.fixture(scope="module")
def classify_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("classify"))
        return fit_and_export(*CLASSIFY)


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("lm"))
        return fit_and_export(*LM)


def test_help_lists_export(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    said = capsys.readouterr().out
    assert re.search(r"^\s+export\s+Export a checkpoint: ONNX, torch.export, model.json", said, re.M)


@pytest.mark.slow
def test_classifier_export_equals_the_checkpoint_and_describes_it(classify_export):
    ckpt, folder, printed = classify_export
    pixels, normalised = classify_test_split()
    reference = Classifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert_same_as_checkpoint(folder, reference, pixels, normalised)
    # The self-check's figures, printed and kept.
    for name in ("onnx", "pt2"):
        assert re.search(rf"^Check {name}: max \|Δlogit\| \S+, argmax agreement 100\.00%", printed, re.M)
    spec = json.loads((folder / "model.json").read_text())
    assert_fields_kept(spec, "image")  # of the previous release
    assert spec["task"] == "image classification"
    assert spec["classes"] == ["c0", "c1", "c2", "c3"]  # the data module's: the checkpoint names none
    assert spec["input"] == {
        "name": "pixels",
        "shape": ["N", 1, 4, 4],
        "dtype": "float32",
        "range": [0.0, 1.0],
    }
    assert spec["output"] == {"name": "logits", "shape": ["N", 4]}
    assert spec["normalisation"] == {"mean": [0.5], "std": [0.25], "inside_graph": True}
    saved = torch.load(ckpt, weights_only=True)
    assert saved["projkit_version"] == projkit.__version__, "a checkpoint names the kit that wrote it"
    assert spec["checkpoint"] == {
        "path": str(ckpt.resolve()),  # deprecated in 1.1.0: checkpoint.file in 1.2.0
        "step": saved["global_step"],
        "epoch": saved["epoch"],
        "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
    }
    assert spec["versions"]["torch"] == torch.__version__
    assert spec["versions"]["projkit"] == importlib.metadata.version("projkit")
    assert spec["versions"]["projkit"] == projkit.__version__  # the code that wrote it
    assert "tinyproj" not in spec["versions"]  # run from the tests' folder, never installed
    assert spec["versions"]["onnxruntime"] == onnxruntime.__version__
    assert spec["check"]["onnx"]["max_abs_logit_difference"] <= 1e-4
    assert spec["check"]["pt2"]["argmax_agreement"] == 1.0


@pytest.mark.slow
def test_token_model_export_equals_the_checkpoint_at_any_length(lm_export):
    ckpt, folder, printed = lm_export
    reference = LanguageModel.load_from_checkpoint(ckpt, map_location="cpu").eval()
    spec = json.loads((folder / "model.json").read_text())
    assert_fields_kept(spec, "text")  # of the previous release
    assert spec["task"] == "next-token prediction"
    assert spec["vocab"] == reference.vocab and spec["input"]["max_T"] == BLOCK_SIZE
    assert spec["input"]["dtype"] == "int64"
    assert spec["output"] == {"name": "logits", "shape": ["N", "T", len(reference.vocab)]}
    # The check ran at an odd shorter length too.
    assert re.search(r"^Check onnx: .* seeded inputs of shape 1x16 and 7x16 and 7x9 ", printed, re.M), printed
    windows = lm_windows(reference)
    for length in (1, 9, BLOCK_SIZE):
        cut = windows[:, :length]
        assert_same_as_checkpoint(folder, reference, cut, cut)


@pytest.mark.slow
def test_best_and_last_export_into_folders_named_by_the_keyword(
    classify_export, tmp_path, monkeypatch, capsys
):
    """``--ckpt_path best`` writes ``export/best/`` whatever the best file is called (its name holds
    its epoch and loss, which no page or script can know), ``last`` ``export/last/``; model.json names
    the file the keyword found. On a copy of the run: the module's other tests read its export/last."""
    ckpt, _, _ = classify_export
    root = ckpt.parents[4]
    shutil.copytree(root / "runs", tmp_path / "runs", ignore=shutil.ignore_patterns("export"))
    run = tmp_path / ckpt.parents[1].relative_to(root)
    monkeypatch.chdir(tmp_path)
    best = next(p for p in (run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    for keyword, found in (("best", best), ("last", run / "checkpoints" / "last.ckpt")):
        capsys.readouterr()
        main(["export", *CLASSIFY, f"--ckpt_path={keyword}", "--formats=onnx"])
        folder = run.relative_to(Path.cwd()) / "export" / keyword
        assert f"Exported {folder}/model.json" in capsys.readouterr().out
        spec = json.loads((folder / "model.json").read_text())
        assert spec["checkpoint"]["path"] == str(found)


@pytest.mark.slow
def test_a_compiled_network_exports(classify_export, workdir):
    # A compiled run's checkpoint: the same weights and keys (the network compiles in place), with
    # `compile: true` among its hyperparameters, which rebuild the model for export.
    ckpt, _, _ = classify_export
    compiled = variant(ckpt, workdir / "checkpoints" / "compiled.ckpt", compile=True)
    folder, _ = export_of(compiled, *CLASSIFY)
    pixels, normalised = classify_test_split()
    reference = Classifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert_same_as_checkpoint(folder, reference, pixels, normalised)


@pytest.mark.slow
def test_an_export_that_computes_otherwise_fails_its_check(classify_export, workdir, capsys, monkeypatch):
    ckpt, _, _ = classify_export
    checkpoint = torch.load(ckpt, weights_only=True)
    net = {**checkpoint["hyper_parameters"]["net"], "class_path": "probes.ExportsOtherwise"}
    variant(ckpt, workdir / "checkpoints" / "other.ckpt", net)
    monkeypatch.delenv("PROJ_DEBUG", raising=False)
    args = [
        "export",
        *CLASSIFY,
        "--model.init_args.net=probes.ExportsOtherwise",
        "--ckpt_path=checkpoints/other.ckpt",
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert re.search(r"^Check pt2: max \|Δlogit\| 1\.00e-03", captured.out, re.M), captured.out
    assert "error: the exported model.pt2 differs from the checkpoint by up to 0.001" in captured.err
    assert "Traceback" not in captured.err
    assert not (workdir / "export").exists() or not any((workdir / "export").rglob("*")), "nothing kept"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((), "error: `export` without --ckpt_path would use untrained weights. Pass --ckpt_path last"),
        (
            ("--ckpt_path=checkpoints/c.ckpt", "--formats=onnx,tflite"),
            "error: --formats: 'tflite' is no export format. Choose from onnx, pt2, comma-separated",
        ),
    ],
    ids=["no-ckpt_path", "unknown-format"],
)
@pytest.mark.slow
def test_an_export_without_a_checkpoint_or_with_an_unknown_format_is_refused(
    flags, message, classify_export, workdir, monkeypatch, capsys
):
    """As a user sees it: the fix on one line, exit status 2, nothing written."""
    (workdir / "checkpoints").mkdir()
    shutil.copy(classify_export[0], workdir / "checkpoints" / "c.ckpt")
    monkeypatch.delenv("PROJ_DEBUG")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", *CLASSIFY, *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (workdir / "export").exists()


@pytest.mark.slow
def test_the_artifacts_run_with_onnxruntime_or_torch_alone(classify_export, lm_export, workdir):
    """What model.json and kit/docs/export.md tell a deployer, in a fresh process that imports neither
    the project, the kit nor Lightning: pixels in [0, 1] into either artifact give the checkpoint's
    classes, and greedy decoding by the vocabulary gives the checkpoint's continuation."""
    _, image_folder, _ = classify_export
    lm_ckpt, text_folder, _ = lm_export
    pixels, normalised = classify_test_split()
    np.save(workdir / "pixels.npy", pixels[:7].numpy())
    prompt, length = "ROMEO:", 30
    driver = f"""
import json, sys
import numpy as np, onnxruntime, torch

image, text = {str(image_folder)!r}, {str(text_folder)!r}
out = {{}}
spec = json.load(open(image + "/model.json"))
pixels = np.load("pixels.npy")
session = onnxruntime.InferenceSession(image + "/model.onnx")
logits = {{
    "onnx": torch.from_numpy(session.run(None, {{spec["input"]["name"]: pixels}})[0]),
    "pt2": torch.export.load(image + "/model.pt2").module()(torch.from_numpy(pixels)).detach(),
}}
for name, value in logits.items():
    probs = value.softmax(-1)
    out[name] = [[spec["classes"][p.argmax()], p.max().item()] for p in probs]

spec = json.load(open(text + "/model.json"))
vocab, max_tokens = spec["vocab"], spec["input"]["max_T"]
session = onnxruntime.InferenceSession(text + "/model.onnx")
program = torch.export.load(text + "/model.pt2").module()
runs = {{
    "onnx": lambda ids: session.run(None, {{spec["input"]["name"]: ids}})[0],
    "pt2": lambda ids: program(torch.from_numpy(ids)).detach().numpy(),
}}
for name, run in runs.items():
    tokens = [vocab.index(c) for c in {prompt!r}]
    for _ in range({length}):
        context = np.array([tokens[-max_tokens:]], dtype=np.int64)
        tokens.append(int(run(context)[0, -1].argmax()))
    out["text_" + name] = "".join(vocab[t] for t in tokens)
out["imported"] = sorted(
    m for m in sys.modules if m.split(".")[0] in ("tinyproj", "projkit", "lightning", "pytorch_lightning")
)
print(json.dumps(out))
"""
    result = subprocess.run([sys.executable, "-c", driver], cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["imported"] == []

    reference = Classifier.load_from_checkpoint(classify_export[0], map_location="cpu").eval()
    with torch.no_grad():
        probs = reference(normalised[:7]).softmax(-1)
    classes = Blobs().classes
    for name in ("onnx", "pt2"):
        assert [c for c, _ in report[name]] == [classes[p.argmax()] for p in probs], name
        assert [p for _, p in report[name]] == pytest.approx(probs.max(-1).values.tolist(), abs=1e-5), name
    model = LanguageModel.load_from_checkpoint(lm_ckpt, map_location="cpu").eval()
    expected = model.generate(prompt, length)
    assert report["text_onnx"] == report["text_pt2"] == expected


@pytest.mark.slow
def test_a_project_not_installed_as_a_distribution_exports(classify_export, workdir, monkeypatch):
    """A project run from its checkout (its package found on ``PYTHONPATH``, never installed, or
    installed under a distribution name other than its import name) has no version metadata of its
    own: export still writes and keeps its artifacts, with the versions there are."""
    package = workdir / "loose_project"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from pathlib import Path\n\nfrom projkit import Project\n\n"
        f"PROJECT = Project(__name__, Path({str(DEFAULTS)!r}))\nmain = PROJECT.main\n"
    )
    monkeypatch.syspath_prepend(str(workdir))
    monkeypatch.delitem(sys.modules, "loose_project", raising=False)
    import loose_project

    ckpt = Path(shutil.copy(classify_export[0], workdir / "loose.ckpt"))
    try:
        folder, _ = export_of(ckpt, *CLASSIFY, run=loose_project.main)
    finally:
        use(PROJECT)  # the commands of the other tests run for tinyproj again
        sys.modules.pop("loose_project", None)
    spec = json.loads((folder / "model.json").read_text())
    assert spec["versions"]["torch"] == torch.__version__
    assert spec["versions"]["projkit"] == importlib.metadata.version("projkit")

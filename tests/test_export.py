"""`python -m proj export` of the template's models: the digits classifier, the other image networks
and the character GPT, whose artifacts compute what their checkpoint computes on the test split and
run without the template, through the examples of kit/examples/ that kit/docs/export.md shows. Export's
machinery (model.json, the check, the refusals, a compiled network) is tested on the kit's tiny
project, in kit/tests/test_export.py."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from projkit.testing import config
from projkit.testing.export import assert_same_as_checkpoint, export_of, fit_and_export, variant

from conftest import ROOT
from proj import main
from proj.data import DigitsDataModule, text
from proj.models import ImageClassifier, LanguageModel
from proj.nets import MLP, TorchvisionNet

EXAMPLES = ROOT / "kit" / "examples"
DIGITS = ("--config", config("digits.yaml"))
VERSE = "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate.\n" * 60
TEXT = ("--config", config("shakespeare_char_cpu.yaml"), "--data.init_args.path=verse.txt")
TINY_GPT = tuple(
    f"--model.init_args.net.init_args.{k}={v}"
    for k, v in {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}.items()
)


def digits_test_split() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits test split as pixels in [0, 1] and as the model takes it (normalised)."""
    data = DigitsDataModule()
    data.setup("test")
    images, labels = data.splits["test"].images, data.splits["test"].labels
    normalised, _ = data.on_after_batch_transfer((images, labels), 0)
    return images.float() / data.scale, normalised


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("digits"))
        return fit_and_export(*DIGITS)


@pytest.fixture(scope="module")
def text_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("text"))
        Path("verse.txt").write_text(VERSE)
        return fit_and_export(*TEXT, *TINY_GPT, "--model.init_args.num_samples=0")


@pytest.mark.slow
def test_digits_export_equals_the_checkpoint_and_describes_it(digits_export):
    ckpt, folder, printed = digits_export
    pixels, normalised = digits_test_split()
    reference = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert_same_as_checkpoint(folder, reference, pixels, normalised)
    # The self-check's figures, printed and kept.
    for name in ("onnx", "pt2"):
        assert re.search(rf"^Check {name}: max \|Δlogit\| \S+, argmax agreement 100\.00%", printed, re.M)
    spec = json.loads((folder / "model.json").read_text())
    assert spec["classes"] == list("0123456789")
    assert spec["input"] == {
        "name": "pixels",
        "shape": ["N", 1, 8, 8],
        "dtype": "float32",
        "range": [0.0, 1.0],
    }
    saved = torch.load(ckpt, weights_only=True)
    assert saved["hyper_parameters"]["classes"] == tuple("0123456789"), "the checkpoint names its classes"
    assert spec["checkpoint"] == {
        "path": str(ckpt.resolve()),  # deprecated in 1.1.0: checkpoint.file in 1.2.0
        "step": saved["global_step"],
        "epoch": saved["epoch"],
        "sha256": hashlib.sha256(ckpt.read_bytes()).hexdigest(),
    }
    assert spec["versions"]["torch"] == torch.__version__ and spec["versions"]["proj"]
    assert spec["check"]["onnx"]["max_abs_logit_difference"] <= 1e-4
    assert spec["check"]["pt2"]["argmax_agreement"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MLP", "TorchvisionNet"])
def test_other_image_networks_export(name, digits_export, workdir):
    # Their checkpoints as `fit` writes them, with freshly initialised weights (training a resnet18
    # on a CPU for a test would cost minutes and change nothing the export does).
    torch.manual_seed(0)
    if name == "MLP":
        net, init_args = MLP(10, (1, 8, 8)), {}
    else:
        init_args = {"name": "resnet18", "weights": None}
        net = TorchvisionNet(num_classes=10, input_shape=(1, 8, 8), **init_args)
    facts = {"num_classes": 10, "input_shape": [1, 8, 8]}  # linked from the data, as fit saves them
    spec = {"class_path": f"proj.nets.{name}", "init_args": {**facts, **init_args}}
    ckpt = variant(digits_export[0], workdir / "checkpoints" / f"{name}.ckpt", spec, net.state_dict())
    options = [f"--model.init_args.net=proj.nets.{name}"]
    options += [f"--model.init_args.net.init_args.{k}={v}" for k, v in init_args.items()]
    folder, _ = export_of(ckpt, *DIGITS, *options)
    pixels, normalised = digits_test_split()
    reference = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    assert type(reference.net) is type(net)
    assert_same_as_checkpoint(folder, reference, pixels, normalised)


@pytest.mark.slow
def test_gpt_export_equals_the_checkpoint_at_any_length(text_export):
    ckpt, folder, _ = text_export
    reference = LanguageModel.load_from_checkpoint(ckpt, map_location="cpu").eval()
    spec = json.loads((folder / "model.json").read_text())
    assert spec["vocab"] == reference.vocab and spec["input"]["max_T"] == 32
    tokens = reference.tokenizer.encode(VERSE[-1000:])
    windows = tokens[: 7 * 32].view(7, 32)
    for length in (1, 17, 32):
        cut = windows[:, :length]
        assert_same_as_checkpoint(folder, reference, cut, cut)


@pytest.mark.slow
def test_gpt_export_and_predict_need_no_text_and_download_nothing(text_export, monkeypatch, capsys):
    """The vocabulary is the checkpoint's, as an image model's classes are: with no text at the
    config's path (in a folder that does not exist, the real url still set), `export` and `predict
    --ckpt_path last` run and download nothing (the download and the network fail the test if called)."""
    ckpt, _, _ = text_export
    monkeypatch.chdir(ckpt.parents[4])

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a download was tried: {args}")

    monkeypatch.setattr(text, "download", no_network)
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    gone = (*TEXT, *TINY_GPT, "--data.init_args.path=no_such_folder/input.txt", "--ckpt_path=last")
    reference = LanguageModel.load_from_checkpoint(ckpt, map_location="cpu")

    main(["export", *gone, "--formats=onnx"])
    exported = re.findall(r"^Exported (.+)$", capsys.readouterr().out, re.M)
    folder = Path("runs/shakespeare_char_cpu/version_0/export/last")
    assert exported == [str(folder / "model.onnx"), str(folder / "model.json")]
    assert json.loads((folder / "model.json").read_text())["vocab"] == reference.vocab
    prompts = '--data.init_args.predict_prompts=["Thou", "Shall"]'
    predicted = main(
        ["predict", *gone, prompts, "--model.init_args.predict_tokens=8", "--model.init_args.temperature=0"]
    )
    expected = [reference.generate(prompt, 8, temperature=0.0) for prompt in ("Thou", "Shall")]
    assert predicted.trainer.predict_loop.predictions == [expected]
    assert not Path("no_such_folder").exists()


@pytest.mark.slow
def test_artifacts_and_examples_run_without_the_template(digits_export, text_export, workdir):
    """Each example as a deployment runs it, in one fresh process that never imports the template
    or Lightning; their answers match the checkpoint's."""
    _, digits, _ = digits_export
    ckpt, text, _ = text_export
    pixels, _ = digits_test_split()
    files = []
    for index in range(3):
        # Each digit drawn 4 times larger, as a 0-255 PNG: the examples shrink it back by averaging.
        image = (pixels[index, 0].numpy() * 255).round().astype(np.uint8)
        files.append(str(workdir / f"digit{index}.png"))
        Image.fromarray(image).resize((32, 32), Image.NEAREST).save(files[-1])
    runs = [
        ("classify_image.py", [str(digits), files[0]]),
        ("predict_pt2.py", [str(digits), *files]),
        ("generate_text.py", [str(text), "Shall", "40", "0"]),
    ]
    driver = f"""
import contextlib, io, json, runpy, sys
sys.path.insert(0, {str(EXAMPLES)!r})  # the script's folder, as `python kit/examples/x.py` has it
outputs = []
for script, argv in {[(str(EXAMPLES / s), a) for s, a in runs]!r}:
    sys.argv = [script, *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(script, run_name="__main__")
    outputs.append(out.getvalue())
imported = sorted(
    m for m in sys.modules if m.split(".")[0] in ("proj", "lightning", "pytorch_lightning")
)
print(json.dumps({{"outputs": outputs, "imported": imported}}))
"""
    result = subprocess.run([sys.executable, "-c", driver], cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["imported"] == []
    classify, predict, generate = report["outputs"]

    # The PNGs hold the pixels to 8 bits; the examples take them back to the 17 levels the digits
    # store (model.json's preprocessing), which are the test split's own pixels.
    reference = ImageClassifier.load_from_checkpoint(digits_export[0], map_location="cpu").eval()
    data = DigitsDataModule()
    mean, std = data.normalisation(torch.device("cpu"))
    with torch.no_grad():
        probs = reference((pixels[:3] - mean) / std).softmax(-1)
    expected = [(str(p.argmax().item()), p.max().item()) for p in probs]
    said = [line.split()[-2:] for line in [classify.strip(), *predict.strip().splitlines()]]
    assert [name for name, _ in said] == [expected[0][0], *(name for name, _ in expected)]
    assert [float(p) for _, p in said] == pytest.approx([expected[0][1], *(p for _, p in expected)], abs=1e-4)
    assert [line.split()[0] for line in predict.strip().splitlines()] == files
    model = LanguageModel.load_from_checkpoint(ckpt, map_location="cpu")
    assert generate.strip() == model.generate("Shall", 40, temperature=0).strip()


@pytest.mark.parametrize(
    "example", ["classify_image.py", "generate_text.py", "predict_pt2.py", "preprocess.py"]
)
def test_docs_show_each_example_as_it_is(example):
    page = (ROOT / "kit" / "docs" / "export.md").read_text()
    block = re.search(rf"<!-- example: kit/examples/{example} -->\n```python\n(.*?\n)```", page, re.S)
    assert block and block.group(1) == (EXAMPLES / example).read_text()
    limit = {"classify_image.py": 20, "generate_text.py": 25}.get(example)
    assert limit is None or len(block.group(1).splitlines()) <= limit


class Payload:
    """Pickled, it opens (so creates) ``marker`` when unpickled: what a tampered archive could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.slow
@pytest.mark.parametrize("part", ["weight", "sample_inputs"])
def test_the_pt2_example_refuses_an_archive_with_pickled_parts(part: str, workdir: Path):
    """torch.export.load unpickles a weight the archive marks as pickled (and sample inputs that
    torch's weights-only reader refuses): the example refuses such a model.pt2 before loading it."""
    folder, marker = workdir / "export", workdir / "ran"
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps({"input": {"shape": [1, 1, 2, 2]}, "classes": ["a"]}))
    program = torch.export.export(torch.nn.Linear(4, 1), (torch.ones(1, 4),))
    torch.export.save(program, folder / "plain.pt2")
    payload = io.BytesIO()
    torch.save(Payload(marker), payload)
    swapped = "/data/weights/weight_0" if part == "weight" else "/data/sample_inputs/model.pt"
    with zipfile.ZipFile(folder / "plain.pt2") as plain, zipfile.ZipFile(folder / "model.pt2", "w") as out:
        for name in plain.namelist():
            data = plain.read(name)
            if part == "weight" and name.endswith("_weights_config.json"):
                data = data.replace(b'"use_pickle": false', b'"use_pickle": true', 1)
            if name.endswith(swapped):
                data = payload.getvalue()
            out.writestr(name, data)
    run = [sys.executable, str(EXAMPLES / "predict_pt2.py"), str(folder), "a.png"]
    result = subprocess.run(run, cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 1 and not marker.exists()
    assert result.stderr.strip().count("\n") == 0 and "pickled objects" in result.stderr

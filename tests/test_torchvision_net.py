"""TorchvisionNet: any torchvision classifier with a head for the data's classes, trained from
scratch or fine-tuned, offline (pretrained weights are stood in for by a fresh model's)."""

from __future__ import annotations

import warnings
from pathlib import Path
from urllib.error import URLError

import pytest
import torch
from projkit.checks.model import warn_if_normalised_otherwise
from projkit.testing import TINY_FIT, config
from torchvision.models import WeightsEnum, get_model

from proj import main
from proj.data import DigitsDataModule
from proj.models import ImageClassifier
from proj.nets import TorchvisionNet

RESNET18 = (
    "--model.init_args.net=proj.nets.TorchvisionNet",
    "--model.init_args.net.init_args.name=resnet18",
)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture
def pretrained(monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """Stands in for the download: every weights enum yields this seeded ResNet-18's state."""
    torch.manual_seed(0)
    state = get_model("resnet18").state_dict()
    monkeypatch.setattr(WeightsEnum, "get_state_dict", lambda self, *args, **kwargs: state)
    return state


@pytest.mark.slow
def test_pretrained_weights_load_with_a_new_head_and_their_normalisation(pretrained):
    net = TorchvisionNet("resnet18", num_classes=10, input_shape=(3, 32, 32), weights="DEFAULT")
    assert net.head_name == "fc" and net.head.out_features == 10
    for name, value in net.model.state_dict().items():
        if not name.startswith("fc."):
            assert torch.equal(value, pretrained[name]), name
    assert net.mean == pytest.approx(IMAGENET_MEAN) and net.std == pytest.approx(IMAGENET_STD)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)

    # The same parameter names with weights and without, so a checkpoint loads into either.
    scratch = TorchvisionNet("resnet18", num_classes=10, input_shape=(3, 32, 32))
    assert scratch.state_dict().keys() == net.state_dict().keys()
    assert scratch.mean is None and scratch.std is None

    grey = TorchvisionNet("resnet18", 10, (1, 8, 8), weights="ResNet18_Weights.IMAGENET1K_V1")
    assert grey.mean == pytest.approx((sum(IMAGENET_MEAN) / 3,))
    assert grey.std == pytest.approx((sum(IMAGENET_STD) / 3,))
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(grey.eval()(x), grey(x.expand(-1, 3, -1, -1)))


@pytest.mark.slow
def test_classifier_warns_when_the_data_normalises_otherwise(pretrained):
    net = TorchvisionNet("resnet18", 10, (1, 8, 8), weights="DEFAULT")
    with pytest.warns(
        UserWarning, match=r"model\.init_args\.net: its pretrained weights expect .* mean \(0\.449"
    ):
        warn_if_normalised_otherwise(net, DigitsDataModule())
    adopted = DigitsDataModule()
    adopted.mean, adopted.std = net.mean, net.std
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_normalised_otherwise(net, adopted)
        warn_if_normalised_otherwise(TorchvisionNet("resnet18", 10, (1, 8, 8)), DigitsDataModule())


def test_unknown_model_is_refused_with_close_matches():
    with pytest.raises(ValueError, match=r"net\.name: torchvision has no classification model 'resnet81'\. "
                       r"Close matches: resnet18"):  # fmt: skip
        TorchvisionNet("resnet81", 10, (3, 32, 32))


def test_unknown_weights_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"net\.weights: resnet18 has no weights 'IMAGENET'\. Choose one of "
                       r"DEFAULT, IMAGENET1K_V1, or null"):  # fmt: skip
        TorchvisionNet("resnet18", 10, (3, 32, 32), weights="IMAGENET")


def test_failed_download_names_the_url_and_the_cache(monkeypatch):
    def offline(self, *args, **kwargs):
        raise URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(WeightsEnum, "get_state_dict", offline)
    with pytest.raises(OSError, match=r"net\.weights=DEFAULT: could not download https://download\.pytorch"
                       r"\.org/models/resnet18-.*\.pth .* into .*checkpoints yourself"):  # fmt: skip
        TorchvisionNet("resnet18", 10, (3, 32, 32), weights="DEFAULT")


@pytest.mark.slow
def test_frozen_backbone_keeps_its_state_while_the_head_learns_and_checkpoints_round_trip(workdir):
    freeze = "--model.init_args.net.init_args.freeze_backbone=true"
    cli = main(["--config", config("digits.yaml"), *RESNET18, freeze, *TINY_FIT], run=False)
    model = cli.model
    assert isinstance(model.net, TorchvisionNet) and model.net.head.out_features == 10  # linked
    before = {name: value.clone() for name, value in model.net.state_dict().items()}
    cli.trainer.fit(model, cli.datamodule)
    after = model.net.state_dict()
    assert cli.trainer.global_step == 2
    head = {"model.fc.weight", "model.fc.bias"}
    for name in before:
        if name in head:
            assert not torch.equal(before[name], after[name]), name
        else:  # the backbone's parameters and its batch norms' statistics
            assert torch.equal(before[name], after[name]), name
    optimized = [p for group in cli.trainer.optimizers[0].param_groups for p in group["params"]]
    assert sum(p.numel() for p in optimized) == 512 * 10 + 10  # the head alone

    last = Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["hyper_parameters"]["net"]["class_path"] == "proj.nets.TorchvisionNet"
    loaded = ImageClassifier.load_from_checkpoint(last)
    assert loaded.net.freeze_backbone and loaded.state_dict().keys() == model.state_dict().keys()
    for name, value in loaded.net.state_dict().items():
        assert torch.equal(value, after[name]), name


@pytest.mark.slow
def test_resnet18_from_scratch_learns_the_digits(workdir):
    few_steps = ("--trainer.max_steps=40", "--trainer.limit_val_batches=1", "--data.batch_size=32",
                 "--model.init_args.scheduler.init_args.warmup_steps=5",
                 "--trainer.enable_progress_bar=false")  # fmt: skip
    cli = main(["fit", "--config", config("digits.yaml"), *RESNET18, *few_steps])
    # 40 steps from scratch: 0.56-0.69 over thread counts, seeds and machines (chance is 0.1), so the
    # bar proves learning with room below the worst rather than a particular accuracy.
    assert cli.trainer.callback_metrics["test/acc"] >= 0.4


@pytest.mark.slow  # a ResNet-18 fast_dev_run; the weights' own normalisation is checked above, fast
def test_the_data_module_normalises_as_the_pretrained_weights_expect(pretrained, workdir):
    from projkit.testing import fit

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = fit(
            "digits.yaml",
            "debug/fast_dev_run.yaml",
            extra=(
                "--model.init_args.net=proj.nets.TorchvisionNet",
                "--model.init_args.net.init_args.name=resnet18",
                "--model.init_args.net.init_args.weights=DEFAULT",
            ),
        )
    assert not [w for w in caught if "pretrained weights expect" in str(w.message)]
    net = cli.model.net
    assert cli.datamodule.mean == pytest.approx(net.mean) and cli.datamodule.std == pytest.approx(net.std)
    assert net.mean != pytest.approx((0.3,)), "the digits' own statistics are not the weights'"

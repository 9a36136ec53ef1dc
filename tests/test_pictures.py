"""Pictures for the loggers that show them: confusion matrices and misclassified images at the end
of validation and test, un-normalised and titled with class names. (W&B's copy: test_wandb.py.)"""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from projkit.testing import TINY_FIT, fit

from proj.data import CIFAR10DataModule, DigitsDataModule, FashionMNISTDataModule, MNISTDataModule
from proj.models.image_classifier import misclassified_figure

PICTURES = ("val/confusion_matrix", "val/misclassified", "test/confusion_matrix", "test/misclassified")


IMAGE_DATA = [DigitsDataModule, MNISTDataModule, FashionMNISTDataModule, CIFAR10DataModule]


@pytest.mark.parametrize("data", IMAGE_DATA)
def test_data_modules_name_each_class(data):
    assert len(data.classes) == data.num_classes == len(set(data.classes))
    assert all(isinstance(name, str) and name for name in data.classes)


def test_to_pixels_shows_the_images_as_stored():
    dm = CIFAR10DataModule()
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    normalised, _ = dm.on_after_batch_transfer((images, torch.zeros(4, dtype=torch.long)), 0)
    torch.testing.assert_close(dm.to_pixels(normalised), images / 255.0)


def test_misclassified_grid_titles_each_image_with_true_and_predicted_class():
    images = torch.rand(10, 1, 8, 8)
    labels, preds = torch.arange(10), (torch.arange(10) + 1) % 10
    figure = misclassified_figure(images, labels, preds, DigitsDataModule.classes)
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == [f"true {i}\npred {(i + 1) % 10}" for i in range(10)]
    assert len(figure.axes) == 16  # 8 columns, 2 rows; the spare axes are blank


@pytest.mark.slow
def test_tensorboard_receives_the_pictures_at_the_end_of_validation_and_test(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cli = fit("digits.yaml", "logger/tensorboard.yaml", extra=TINY_FIT)
    events = EventAccumulator(cli.trainer.logger.log_dir)
    events.Reload()
    assert sorted(events.Tags()["images"]) == sorted(PICTURES)
    for tag in PICTURES:
        [picture] = events.Images(tag)  # once per epoch end, none from the sanity check
        assert picture.step == cli.trainer.global_step == 2
        image = Image.open(io.BytesIO(picture.encoded_image_string))
        assert image.mode == "RGB" and min(image.size) >= 300

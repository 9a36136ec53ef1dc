"""Image data modules: seeded splits, batches cut by indexing, train-only augmentation, and the
real torchvision readers on files in the official formats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch import seed_everything
from projkit.data.in_memory import TensorImageDataset
from torch.utils.data import Dataset

from conftest import fake_images
from proj.data import CIFAR10DataModule, DigitsDataModule, MNISTDataModule
from proj.data.augment import random_translate


def labels_of(dm: DigitsDataModule, split: str) -> torch.Tensor:
    return dm.splits[split].labels


def test_digits_splits_are_seeded_and_cover_the_data_once():
    seed_everything(1)
    first = DigitsDataModule()
    first.setup("fit")
    seed_everything(2)  # the training seed must not move the split
    second = DigitsDataModule()
    second.setup("fit")
    sizes = {name: len(ds) for name, ds in first.splits.items()}
    assert sizes == {"train": 1294, "val": 144, "test": 359}
    assert sum(sizes.values()) == 1797
    for split in ("train", "val", "test"):
        assert torch.equal(first.splits[split].images, second.splits[split].images)
    other = DigitsDataModule(split_seed=7)
    other.setup("fit")
    assert not torch.equal(other.splits["test"].images, first.splits["test"].images)


def test_batches_are_cut_by_indexing_not_per_sample(monkeypatch):
    dm = DigitsDataModule(batch_size=32)
    dm.setup("fit")

    def per_sample(self, index):
        raise AssertionError("per-sample __getitem__ called")

    monkeypatch.setattr(TensorImageDataset, "__getitem__", per_sample)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.uint8, "batches travel as stored"
    assert y.shape == (32,) and y.dtype == torch.int64


def test_normalised_inputs_are_roughly_standard():
    dm = DigitsDataModule(batch_size=2000)
    dm.setup("fit")
    x, _ = dm.on_after_batch_transfer(next(iter(dm.val_dataloader())), 0)
    assert x.dtype == torch.float32
    assert abs(x.mean().item()) < 0.1
    assert abs(x.std().item() - 1) < 0.1


def test_augmentation_touches_training_batches_only():
    from lightning.pytorch import Trainer

    dm = DigitsDataModule(batch_size=64, augment=True)
    dm.setup("fit")
    dm.trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    batch = next(iter(dm.val_dataloader()))
    torch.manual_seed(0)
    dm.trainer.training = True
    assert not torch.equal(dm.on_after_batch_transfer(batch, 0)[0], dm.on_after_batch_transfer(batch, 0)[0])
    dm.trainer.validating = True
    assert torch.equal(dm.on_after_batch_transfer(batch, 0)[0], dm.on_after_batch_transfer(batch, 0)[0])


def test_training_order_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch():
    from projkit.reliability import ResumableSampler

    data = list(range(100))
    order = list(ResumableSampler(data, seed=3))
    assert sorted(order) == data and order != data
    assert list(ResumableSampler(data, seed=3)) == order
    later = ResumableSampler(data, seed=3)
    later.set_epoch(1)
    assert list(later) != order
    resumed = ResumableSampler(data, seed=3)
    resumed.start = 40
    assert list(resumed) == order[40:]
    assert list(resumed) == order, "the skip applies to one epoch only"
    shards = [list(ResumableSampler(data, num_replicas=2, rank=r, seed=3)) for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == data
    assert len(list(ResumableSampler(data, seed=3, epoch_size=30))) == 30
    keyed = list(ResumableSampler(data, seed=3, keyed=True))
    assert [index for index, _ in keyed] == order, "the seeds per position leave the order alone"
    resumed = ResumableSampler(data, seed=3, keyed=True)
    resumed.start = 40
    assert list(resumed) == keyed[40:]


class NoisyItems(Dataset):
    """A per-item dataset with a random transform: each image plus noise drawn from torch's RNG."""

    def __init__(self, images: TensorImageDataset) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.images[index]
        return image + torch.randint(0, 2, image.shape, dtype=torch.uint8), label


def test_a_per_item_dataset_gets_default_collation_workers_and_repeatable_draws():
    dm = DigitsDataModule(batch_size=32)
    dm.setup("fit")
    dm.splits["train"] = NoisyItems(dm.splits["train"])
    before = torch.get_rng_state()
    x, y = next(iter(dm.train_dataloader()))  # Lightning's default collation: a list
    assert torch.equal(torch.get_rng_state(), before), "the global RNG, dropout's, is left alone"
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.uint8 and y.shape == (32,)
    assert dm.on_after_batch_transfer([x, y], 0)[0].dtype == torch.float32
    dm.hparams.num_workers = 2
    in_workers = list(dm.train_dataloader())
    assert torch.equal(in_workers[0][0], x), "the same noise drawn in a worker as in this process"


def test_random_translate_shifts_each_image_within_the_padding():
    x = torch.zeros(200, 1, 5, 5)
    x[:, :, 2, 2] = 1.0
    torch.manual_seed(0)
    shifted = random_translate(x, pad=1)
    positions = {tuple(torch.nonzero(img[0])[0].tolist()) for img in shifted}
    assert positions == {(r, c) for r in (1, 2, 3) for c in (1, 2, 3)}
    assert torch.equal(shifted.sum(dim=(1, 2, 3)), torch.ones(200))


def test_mnist_reads_idx_files_with_torchvision(image_data):
    dm = MNISTDataModule(data_dir=str(image_data))
    dm.prepare_data()
    images, labels = dm.load(train=False)
    expected_images, expected_labels = fake_images(100, (28, 28), seed=1)
    assert images.shape == (100, 1, 28, 28) and images.dtype == torch.uint8
    assert np.array_equal(images[:, 0].numpy(), expected_images)
    assert np.array_equal(labels.numpy(), expected_labels)
    dm.setup("fit")
    assert len(dm.splits["train"]) + len(dm.splits["val"]) == 200


def test_cifar10_reads_python_batches_with_torchvision(image_data):
    dm = CIFAR10DataModule(data_dir=str(image_data))
    dm.prepare_data()
    images, labels = dm.load(train=False)
    expected_images, expected_labels = fake_images(40, (3, 32, 32), seed=5)
    assert images.shape == (40, 3, 32, 32)
    assert np.array_equal(images.numpy(), expected_images)
    assert np.array_equal(labels.numpy(), expected_labels)


def test_absent_dataset_without_download_says_where_files_go(workdir):
    dm = MNISTDataModule(data_dir="nowhere")
    with pytest.raises(FileNotFoundError, match=r"MNIST not found in 'nowhere'.*IDX files"):
        dm.setup("fit")

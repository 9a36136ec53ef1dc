"""Every checkpoint records the kit version that wrote it (``projkit_version``, beside Lightning's own
``pytorch-lightning_version``), so a checkpoint from before an upgrade can be told apart and a report
names the code that made it."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer

import projkit

KEY = "projkit_version"


class KitVersion(Callback):
    """Writes ``projkit.__version__`` into each checkpoint the trainer saves. The CLI adds it to every
    command; it has no setting."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        checkpoint[KEY] = projkit.__version__

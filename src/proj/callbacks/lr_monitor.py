"""Lightning's LearningRateMonitor under plain names: ``lr``, not ``lr-AdamW/pg1`` and ``lr-AdamW/pg2``."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor as _LearningRateMonitor


class LearningRateMonitor(_LearningRateMonitor):
    """Logs ``lr`` when every parameter group trains at the same rate, and ``lr/<group name>``
    (``lr/decay``, ``lr/no_decay``) when they differ; likewise ``momentum`` and ``weight_decay``
    when those are logged.

    Lightning names each group of each optimizer (``lr-AdamW/pg1``), so the template's two groups
    (decayed and not, ``proj.optim.param_groups``) give two columns holding the same rate. With
    more than one optimizer Lightning's names are kept: they say which optimizer a rate is of.

    Lightning offers no public hook for the names: this overrides ``_extract_stats``, the one
    method that gathers what its hooks log (``tests/test_lr_monitor.py`` fails if it changes).
    """

    def _extract_stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        stats = super()._extract_stats(trainer, interval)
        if not stats or len(trainer.optimizers) != 1:
            return stats
        groups = trainer.optimizers[0].param_groups
        # Lightning's rate names, in the order of the groups; the other stats append a suffix.
        names = [name for name in stats if name in self.lrs]
        renamed: dict[str, float] = {}
        for kind, suffix in (("lr", ""), ("momentum", "-momentum"), ("weight_decay", "-weight_decay")):
            values = [stats[name + suffix] for name in names if name + suffix in stats]
            if not values:
                continue
            if len(set(values)) == 1:
                renamed[kind] = values[0]
            else:
                for index, (group, value) in enumerate(zip(groups, values, strict=True), start=1):
                    renamed[f"{kind}/{group.get('name', f'pg{index}')}"] = value
        for name in stats:
            trainer.callback_metrics.pop(name, None)
        device = trainer.strategy.root_device
        trainer.callback_metrics.update(
            {name: torch.tensor(value, device=device) for name, value in renamed.items()}
        )
        return renamed

"""What the kit takes from torchmetrics' internals: a metric's value of the last ``forward``.

Checked with torchmetrics 1.6 to 1.9; ``kit/tests/test_internals.py`` tests it on Lightning's logged
results. torchmetrics keeps that value in ``Metric._forward_cache`` and has no public accessor; the
value Lightning logs on a step is read from there.
"""

from __future__ import annotations

from typing import Any

from projkit.internals import LibraryChanged, existing

TORCHMETRICS = "torchmetrics"
PURPOSE = "read the progress bar's values once per step"


def forward_value(metric: Any) -> Any:
    """The value ``metric`` computed in its last ``forward`` (what a step's ``self.log`` logged)."""
    return existing(metric, "_forward_cache", TORCHMETRICS, PURPOSE)


def set_forward_value(metric: Any, value: Any) -> None:
    """Replace that value (by a copy on the host, read by Lightning at every batch's end)."""
    if not hasattr(metric, "_forward_cache"):
        raise LibraryChanged(TORCHMETRICS, "Metric._forward_cache", PURPOSE)
    metric._forward_cache = value

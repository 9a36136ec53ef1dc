"""The kit names other libraries' private names in its seams alone (``projkit.internals``, one module
per library), where each has a contract test (test_internals.py): a library's release that moves one
then fails there, by name, not somewhere a user runs into it."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import projkit
from private_names import PACKAGE, SEAMS, private_overrides, private_uses, uses_in

SEAM_MODULES = {"lightning", "torchmetrics", "jsonargparse", "torch", "stdlib", "litdata"}


def test_no_private_name_of_another_library_is_used_outside_the_seams():
    outside = [str(use) for use in private_uses() if not use.path.is_relative_to(SEAMS)]
    assert not outside, "move these into projkit/internals/<library>.py:\n" + "\n".join(outside)


def test_no_class_outside_the_seams_overrides_a_private_method_of_another_library(tmp_path, monkeypatch):
    modules = [
        module.name
        for module in pkgutil.walk_packages(projkit.__path__, "projkit.")
        if not module.name.startswith(("projkit.internals", "projkit.testing"))
        and not module.name.endswith("__main__")
    ]
    assert len(modules) > 40
    assert private_overrides(modules) == []
    # An override is found, so the check above can fail (the seams hold none at present).
    (tmp_path / "overriding.py").write_text(
        "import argparse\n\n\nclass Parser(argparse.ArgumentParser):\n"
        "    def _get_values(self, action, strings):\n        return super()._get_values(action, strings)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert private_overrides(["overriding"]) == ["overriding.Parser._get_values"]


def test_the_finder_finds_each_kind_of_private_use():
    source = (
        "from lightning.pytorch.tuner.batch_size_scaling import _reset_dataloaders\n"
        "from torch.utils._pytree import tree_leaves\n"
        "import torch._dynamo\n"
        "x = trainer._results\n"
        "y = getattr(trainer, '_val_check_time_interval', None)\n"
        "z = f'{name}_loop'\n"
        "self._own = 1\n"
        "w = self._own\n"
        "os._exit(1)\n"
        "loader.restore = False\n"
        "loader.current_epoch = 3\n"
    )
    found = {use.name for use in uses_in(Path("m.py"), source, own={"_own"})}
    assert found == {
        "_reset_dataloaders",
        "torch.utils._pytree",
        "torch._dynamo",
        "_results",
        "_val_check_time_interval",
        "restore",
        "current_epoch",
    }
    # LitData's loader's flag, read; an epoch read (Lightning's trainer and module name one) is public.
    read = "restoring = self.restore\nepoch = trainer.current_epoch\n"
    assert [use.name for use in uses_in(Path("m.py"), read, own=set())] == ["restore"]


def test_each_seam_is_one_library_and_names_what_it_relies_on():
    seams = {path.stem for path in SEAMS.glob("*.py")} - {"__init__"}
    assert seams == SEAM_MODULES
    for seam in seams:
        text = (SEAMS / f"{seam}.py").read_text()
        assert "Checked with" in text, f"internals/{seam}.py says no version it was checked with"
    assert PACKAGE.name == "projkit"

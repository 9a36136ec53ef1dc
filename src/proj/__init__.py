"""proj: image classification and a character-level GPT, trained with the projkit template.

This package is the project's own: its models, networks and data. The command line and everything
else a run needs come from the kit (``projkit``), which reads this project's configs/defaults.yaml
first: ``python -m proj fit --config configs/digits.yaml``,
or ``proj.main(["fit", ...])`` in Python.
"""

from pathlib import Path

from projkit import Project

__version__ = "0.1.0"

PROJECT = Project(__name__, Path(__file__).resolve().parents[2] / "configs" / "defaults.yaml")
run = PROJECT.run
main = PROJECT.main

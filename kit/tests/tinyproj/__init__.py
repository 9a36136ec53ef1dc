"""A tiny project on the kit, shaped as an owner's package is: the kit's own tests run its commands
(``python -m tinyproj fit --config …``, or ``tinyproj.main([...])`` in the test's process) on two
tasks that train in seconds, so that they test the machinery and no example of the template."""

from pathlib import Path

from projkit import Project

CONFIGS = Path(__file__).resolve().parent / "configs"
PROJECT = Project(__name__, CONFIGS / "defaults.yaml")
run = PROJECT.run
main = PROJECT.main

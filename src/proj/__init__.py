"""proj: a PyTorch Lightning project template (one CLI, configs that compose, two example tasks)."""

__version__ = "0.1.0"

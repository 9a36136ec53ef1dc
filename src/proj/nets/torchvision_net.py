"""Any torchvision classification model, pretrained or not, with a head for the data's classes."""

from __future__ import annotations

import difflib
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.models import WeightsEnum, get_model, get_model_weights, list_models

# Their forward also returns auxiliary classifiers' outputs in training; without those, logits only.
AUXILIARY_HEADS = ("googlenet", "inception_v3")


class TorchvisionNet(nn.Module):
    """A torchvision classification model, ``torchvision.models.get_model(name, weights=…)``, to
    fine-tune or to train from scratch on the template's image data.

    The model's last linear layer (``fc``, ``classifier[-1]``, ``heads.head``, …) is replaced by one
    with ``num_classes`` outputs, with weights or without, so the parameter names are the same
    either way and a checkpoint loads into whatever network its config builds. Grey images (one
    channel in ``input_shape``) are repeated to the three channels the models take, which is what
    a first convolution with its kernels summed over the colours would compute.

    ``weights`` names torchvision weights of that model: ``DEFAULT`` (the best there is), a member
    such as ``IMAGENET1K_V1``, or its full name ``ResNet18_Weights.IMAGENET1K_V1``; they are
    downloaded once into torch's cache (``$TORCH_HOME``, by default ``~/.cache/torch``). Such weights
    learned on images normalised their own way: ``mean`` and ``std`` are that normalisation, with
    as many values as ``input_shape`` has channels (for grey images the average of the colours), and
    None without weights. The data should be normalised with them instead of the data's own.

    ``freeze_backbone`` trains the new head alone: every other parameter keeps its value (and stays
    out of the optimizer) and the batch norms keep their running statistics.
    """

    def __init__(
        self,
        name: str,
        num_classes: int,
        input_shape: tuple[int, int, int],
        weights: str | None = None,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__()
        channels = input_shape[0]
        if channels not in (1, 3):
            raise ValueError(
                f"net.input_shape: torchvision models take colour (3-channel) or, repeated, grey "
                f"(1-channel) images; this data has {channels} channels. Use a network of proj.nets, "
                "which take any number."
            )
        resolved = resolve_weights(name, weights)
        options = {"aux_logits": False} if name in AUXILIARY_HEADS else {}
        try:
            self.model = get_model(name, weights=resolved, **options)
        except OSError as error:  # urllib's errors when offline; a failed write to the cache
            raise OSError(
                f"net.weights={weights}: could not download {resolved.url} ({error}). Copy that file "
                f"into {Path(torch.hub.get_dir()) / 'checkpoints'} yourself, or set net.weights to null "
                "to train from scratch."
            ) from error
        self.head_name = replace_head(self.model, num_classes, name)
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None
        if resolved is not None:
            preprocess = resolved.transforms()
            self.mean, self.std = tuple(preprocess.mean), tuple(preprocess.std)
            if channels == 1:
                self.mean, self.std = (sum(self.mean) / 3,), (sum(self.std) / 3,)
        self.freeze_backbone = freeze_backbone
        if freeze_backbone:
            for param_name, param in self.model.named_parameters():
                if not param_name.startswith(f"{self.head_name}."):
                    param.requires_grad_(False)

    @property
    def head(self) -> nn.Linear:
        """The classification layer that replaced the model's own."""
        return self.model.get_submodule(self.head_name)

    def train(self, mode: bool = True) -> TorchvisionNet:
        # A frozen backbone is a fixed function: its batch norms normalise with the statistics they
        # came with instead of drifting towards each training batch's. (Training code calls train()
        # before it starts: TaskModule does.)
        super().train(mode)
        if self.freeze_backbone:
            for module in self.model.modules():
                if getattr(module, "track_running_stats", False):
                    module.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.model(x)


def resolve_weights(name: str, weights: str | None) -> WeightsEnum | None:
    """The weights enum member ``weights`` names for model ``name``, refusing an unknown model or
    weights with the choices there are."""
    names = list_models(module=torchvision.models)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"Close matches: {', '.join(close)}." if close else f"Some: {', '.join(names[:8])}, …"
        raise ValueError(
            f"net.name: torchvision has no classification model {name!r}. {hint} "
            f"torchvision.models.list_models(module=torchvision.models) lists all {len(names)}."
        )
    if weights is None:
        return None
    enum = get_model_weights(name)
    try:
        return enum.verify(weights)
    except KeyError:
        choices = ", ".join(["DEFAULT", *(member.name for member in enum)])
        raise ValueError(
            f"net.weights: {name} has no weights {weights!r}. Choose one of {choices}, or null to "
            "train from scratch."
        ) from None


def replace_head(model: nn.Module, num_classes: int, name: str) -> str:
    """Replace the model's last linear layer, its classifier, by one with ``num_classes`` outputs
    (freshly initialised) and return that layer's name."""
    linears = [module_name for module_name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError(
            f"net.name: {name} has no linear layer to replace by a head of num_classes outputs (its "
            "classifier is a convolution). Choose another model."
        )
    old = model.get_submodule(linears[-1])
    model.set_submodule(linears[-1], nn.Linear(old.in_features, num_classes, bias=old.bias is not None))
    return linears[-1]

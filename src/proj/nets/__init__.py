"""Plain ``nn.Module`` networks, free of Lightning, chosen by ``class_path`` in a config.

Image networks take ``num_classes`` and ``input_shape`` (C, H, W): the CLI links both from the data
module, so configs set only the architecture's own sizes; ``TorchvisionNet`` wraps any torchvision
classification model, with or without its pretrained weights. The language model ``GPT`` takes
``vocab_size`` from the data module and hands its ``block_size`` to it.
"""

from proj.nets.convnet import ConvNet
from proj.nets.gpt import GPT
from proj.nets.mlp import MLP
from proj.nets.torchvision_net import TorchvisionNet

__all__ = ["GPT", "MLP", "ConvNet", "TorchvisionNet"]

"""What the kit takes from torch's internals: the dispatch mode that sees every operation, pytree
leaves, the private aten operations that read a device value, and two multi-tensor operations.

Checked with torch 2.6 to 2.15; ``kit/tests/test_internals.py`` tests each on a real operation.
``TorchDispatchMode`` is documented (the "__torch_dispatch__" extension point) but lives in the
private ``torch.utils._python_dispatch``; pytree has no public module before it is promoted.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from projkit.internals import LibraryChanged, existing

TORCH = "torch"
READS = "count the host's reads of device values"
aten = torch.ops.aten


def _op(name: str) -> torch._ops.OpOverloadPacket:
    try:
        return getattr(aten, name)
    except AttributeError:
        raise LibraryChanged(TORCH, f"torch.ops.aten.{name}", READS) from None


# The operation every ``Tensor.item()``, ``float(t)``, ``bool(t)`` of a device value goes through.
LOCAL_SCALAR_DENSE = _op("_local_scalar_dense")
# Private forms of ``unique`` and of boolean-mask assignment, which the public ones dispatch to.
UNIQUE_OPS = {_op("_unique"), _op("_unique2")}
INDEX_PUT_IMPL = _op("_index_put_impl_")

# The multi-tensor operations torch's own optimizers and ``clip_grad_norm_`` run on a list of
# gradients in a few kernels: no public name has them.
GUARD = "check and zero a training step's gradients in a few multi-tensor operations"
foreach_norm = existing(torch, "_foreach_norm", TORCH, GUARD)
foreach_mul_ = existing(torch, "_foreach_mul_", TORCH, GUARD)

__all__ = [
    "INDEX_PUT_IMPL",
    "LOCAL_SCALAR_DENSE",
    "UNIQUE_OPS",
    "TorchDispatchMode",
    "foreach_mul_",
    "foreach_norm",
    "tree_leaves",
]

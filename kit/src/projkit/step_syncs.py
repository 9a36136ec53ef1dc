"""Counts what would hold up a GPU in each training step, on any device, the CPU included: the reads
of a device value by the host (``Tensor.item``, ``bool``, ``float``, ``.tolist()``, ``.cpu()``,
``.numpy()``, an operation whose output size depends on values, such as ``nonzero`` or a boolean
mask) and the collectives issued from Python.

A CPU has no device to wait for, so "a device value" is tracked: a tensor of the batch, of the
module (parameters, buffers, metric states) or computed from one of them. Tensors made from
nothing (``torch.zeros(3)``, an optimizer's step count) stay host values, as they would on a GPU
unless made there on purpose; a read of one made on the device from nothing is missed, the one blind
spot. ``projkit.testing.SyncCounter`` is the callback that counts them.
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from projkit.internals.torch import (
    INDEX_PUT_IMPL,
    LOCAL_SCALAR_DENSE,
    UNIQUE_OPS,
    TorchDispatchMode,
    tree_leaves,
)

aten = torch.ops.aten

# Tensor methods that copy a value to the host (and wait for the device to compute it first).
READS = {
    "item", "__bool__", "__float__", "__int__", "__index__", "__format__", "__repr__", "__array__",
    "tolist", "numpy", "cpu",
}  # fmt: skip
# Operations whose output's size depends on the values: the host reads them before it can go on.
SIZED_BY_VALUES = {
    aten.nonzero, aten.masked_select, *UNIQUE_OPS, aten.unique_dim,
    aten.unique_consecutive, aten.bincount, aten.histc, aten.equal, aten.repeat_interleave,
}  # fmt: skip
MASK_INDEXED = {aten.index, aten.index_put, aten.index_put_, INDEX_PUT_IMPL}
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "gather_object", "scatter", "scatter_object_list", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
)  # fmt: skip
# What CUDA's sync debug mode warns with.
CUDA_SYNC = "called a synchronizing CUDA operation"
HERE = os.path.abspath(__file__)
WARNINGS = os.path.abspath(warnings.__file__)
TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@dataclass
class Event:
    """One sync or collective: what it was, and the first line outside torch that asked for it."""

    kind: str  # "sync", "collective" (the host waits for it) or "async collective"
    what: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} {self.what} at {self.where}"


@dataclass
class Window:
    """What happened from one training batch's start to the next's."""

    batch: int
    global_step: int
    events: list[Event] = field(default_factory=list)
    special: set[str] = field(default_factory=set)  # why it is no ordinary step


def caller(depth: int = 4) -> str:
    """The innermost ``depth`` frames of the stack outside torch and this module, innermost first,
    each as ``path:line (function)`` with the path from its package's folder on."""
    frame, shown = inspect.currentframe().f_back, []
    while frame is not None and len(shown) < depth:
        path = os.path.abspath(frame.f_code.co_filename)
        if path not in (HERE, WARNINGS) and not path.startswith(TORCH):
            parts = path.split(os.sep)
            start = parts.index("site-packages") + 1 if "site-packages" in parts else len(parts) - 3
            shown.append(f"{os.sep.join(parts[start:])}:{frame.f_lineno} ({frame.f_code.co_name})")
        frame = frame.f_back
    return " < ".join(shown) or "?"


class DeviceValues:
    """Which tensors would live on the device: the marked ones and every result computed from
    them. Weakly held, so the tracking keeps no tensor alive."""

    def __init__(self) -> None:
        self._marked: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def mark(self, *trees: Any) -> None:
        for leaf in tree_leaves(trees):
            if isinstance(leaf, torch.Tensor):
                self._marked[leaf] = True

    def unmark(self, tensor: torch.Tensor) -> None:
        self._marked.pop(tensor, None)

    def holds(self, *trees: Any) -> bool:
        return any(isinstance(leaf, torch.Tensor) and leaf in self._marked for leaf in tree_leaves(trees))


class Recorder(TorchDispatchMode):
    """Propagates device values through every operation and records the host's reads of them."""

    def __init__(self, values: DeviceValues, record: Callable[[str, str], None]) -> None:
        super().__init__()
        self.values = values
        self.record = record
        self.reading = threading.local()  # inside a read the method-level view recorded already

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_device = self.values.holds(args, kwargs)
        if on_device and not getattr(self.reading, "depth", 0):
            packet = func.overloadpacket
            if packet is LOCAL_SCALAR_DENSE:
                self.record("sync", "a tensor read as a Python number")
            elif packet in SIZED_BY_VALUES or (packet in MASK_INDEXED and masked(args)):
                self.record("sync", f"torch.{packet.__name__} (its size depends on the values)")
        out = func(*args, **kwargs)
        if on_device:
            self.values.mark(out)
        return out


def masked(args: tuple) -> bool:
    """Whether an indexing operation's indices include a boolean mask (a ``nonzero`` on the device)."""
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in tree_leaves(indices)
    )


class MethodReads(TorchFunctionMode):
    """Records the Tensor methods that read a device value, under their own names."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name, kwargs = getattr(func, "__name__", ""), kwargs or {}
        # A device value's ``.to("cpu")`` copies on a GPU: a read (on the CPU it may return itself).
        # Torch's own ``.to(device)`` calls move values to where they are on one device (norms).
        copies = name == "to" and to_host(args, kwargs) and not in_torch(inspect.currentframe().f_back)
        if not (name in READS or copies) or not args or not self.recorder.values.holds(args[0]):
            return func(*args, **kwargs)
        self.recorder.record("sync", f"Tensor.{name}")
        reading = self.recorder.reading
        reading.depth = getattr(reading, "depth", 0) + 1
        try:
            out = func(*args, **kwargs)
        finally:
            reading.depth -= 1
        if isinstance(out, torch.Tensor) and out is not args[0]:
            self.recorder.values.unmark(out)  # a copy on the host: reading it waits for nothing
        return out


def in_torch(frame: Any) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(TORCH)


def to_host(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call copies to the CPU."""
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str | torch.device) and torch.device(target).type == "cpu"


class Watch:
    """While entered: device values tracked, and each read or collective handed to ``record`` as
    an ``Event``. ``cuda``: on a GPU, the synchronisations are CUDA's own report of them
    (``torch.cuda.set_sync_debug_mode("warn")``) instead of the tracking."""

    def __init__(self, record: Callable[[Event], None], cuda: bool = False) -> None:
        self.values = DeviceValues()
        self.record = lambda kind, what: record(Event(kind, what, caller()))
        self.cuda = cuda
        self._recorder = Recorder(self.values, self.record)
        self._methods = MethodReads(self._recorder)
        self._patched: list[tuple[Any, str, Any]] = []
        self._inside = threading.local()
        self._warnings = warnings.catch_warnings()

    def __enter__(self) -> Watch:
        if self.cuda:
            self._warnings.__enter__()
            warnings.filterwarnings("always", message=CUDA_SYNC)
            shown = warnings.showwarning

            def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
                if CUDA_SYNC in str(message):
                    self.record("sync", str(message).splitlines()[0])
                else:
                    shown(message, *args, **kwargs)

            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
        else:
            self._recorder.__enter__()
            self._methods.__enter__()
        if torch.distributed.is_available():
            from torch.distributed import distributed_c10d

            for module in (torch.distributed, distributed_c10d):
                for name in COLLECTIVES:
                    if hasattr(module, name):
                        self._patch(module, name)
        if torch.cuda.is_available() and not self.cuda:
            self._patch(torch.cuda, "synchronize")
        return self

    def _patch(self, module: Any, name: str) -> None:
        original = getattr(module, name)
        record, inside = self.record, self._inside

        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "depth", 0):  # all_gather_object calls all_gather: one collective
                return original(*args, **kwargs)
            if name == "synchronize":
                record("sync", "torch.cuda.synchronize")
            else:
                kind = "async collective" if kwargs.get("async_op") else "collective"
                record(kind, f"torch.distributed.{name}")
            inside.depth = 1
            try:
                return original(*args, **kwargs)
            finally:
                inside.depth = 0

        setattr(module, name, counted)
        self._patched.append((module, name, original))

    def __exit__(self, *exc: object) -> None:
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        self._patched = []
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self._warnings.__exit__(*exc)
        else:
            self._methods.__exit__(*exc)
            self._recorder.__exit__(*exc)

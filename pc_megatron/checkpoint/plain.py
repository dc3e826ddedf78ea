"""The loop and scheduler state of a checkpoint as plain data, so that ``state.pt`` loads with
``torch.load(weights_only=True)``: reading a checkpoint runs no code, and moving a class does not
break old checkpoints.

What the state holds beyond containers, numbers, strings and tensors is written under a name of
this module's own table (``TYPES``), never as a pickled class: the dataclasses the scheduler keeps in
its replay buffer (``Sample`` and the engine's ``Completion``) and NumPy arrays and scalars (NumPy's
RNG state). Anything else is refused when the checkpoint is written, naming where it sits, so a new
kind of state is noticed by the tests, not by the first resume.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from pc_megatron.batch import Completion
from pc_megatron.scheduler.types import Sample

TYPES: dict[str, type] = {"Sample": Sample, "Completion": Completion}
"""The dataclasses a checkpoint may hold, by the name written for them (keep a name when its class moves)."""
_NAMES = {cls: name for name, cls in TYPES.items()}
_TAG = "__pcm_type__"


def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` in the types ``torch.load(weights_only=True)`` reads."""
    if isinstance(obj, np.generic):  # before float: np.float64 is one
        return obj.item()
    if obj is None or type(obj) in (bool, int, float, str) or isinstance(obj, torch.Tensor):
        return obj  # exact types: a str or int enum would pickle its class
    if isinstance(obj, np.ndarray):
        return {_TAG: "ndarray", "dtype": obj.dtype.str, "data": obj.tolist()}
    if type(obj) in _NAMES:
        fields = {f.name: to_plain(getattr(obj, f.name), f"{where}.{f.name}") for f in dataclasses.fields(obj)}
        return {_TAG: _NAMES[type(obj)], "fields": fields}
    if isinstance(obj, dict):
        if _TAG in obj:
            raise TypeError(f"{where}: a dict with the key {_TAG!r}, which the checkpoint format reserves")
        return {k: to_plain(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    raise TypeError(
        f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} in the checkpoint state, which is written "
        "as plain data only: convert it, or add its dataclass to pc_megatron.checkpoint.plain.TYPES"
    )


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`."""
    if isinstance(obj, dict):
        tag = obj.get(_TAG)
        if tag == "ndarray":
            return np.asarray(obj["data"], dtype=np.dtype(obj["dtype"]))
        if tag is not None:
            if tag not in TYPES:
                raise ValueError(f"the checkpoint holds a {tag!r}, which this version does not know")
            return TYPES[tag](**{k: from_plain(v) for k, v in obj["fields"].items()})
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj


def legacy_globals() -> list:
    """What a checkpoint written before its state was plain data may name, and nothing else: the two
    dataclasses (``Completion`` also under its earlier module) and NumPy's array pieces of its RNG
    state. ``weights_only`` loading builds these and runs no other code."""
    from numpy._core.multiarray import _reconstruct

    uint32 = type(np.dtype(np.uint32))
    return [
        *TYPES.values(),
        (Completion, "pc_megatron.rollout.base.Completion"),
        np.ndarray,
        np.dtype,
        uint32,
        _reconstruct,
    ]

"""Named ranges for the phases of a step, visible to ``torch.profiler`` (on CPU and GPU) and, on
GPU, to Nsight Systems as NVTX ranges.

Off unless a profile asks for them: ``phase_range`` then returns one shared no-op context, so a
run that does not profile pays a dictionary lookup per phase and nothing else. ``enable()`` turns
them on in this process and, through the ``PC_MEGATRON_PHASE_RANGES`` variable that the Ray
runtime forwards to every actor, in the learner and engine processes it starts afterwards.
``nsys profile -t cuda,nvtx pc-megatron train ... `` with ``PC_MEGATRON_PHASE_RANGES=1`` in
the environment shows the same names without ``torch.profiler``. (A module of its own, low in the
house: the learner and the engines mark their phases with it; ``pc-megatron profile``, which runs
the training loop, reads them.)
"""

from __future__ import annotations

import contextlib
import os
import time

ENV = "PC_MEGATRON_PHASE_RANGES"
_NULL = contextlib.nullcontext()
_state = {"on": os.environ.get(ENV) == "1"}
_names: set[str] = set()  # every range opened in this process (left out of the operator table)


def enable() -> None:
    os.environ[ENV] = "1"
    _state["on"] = True


def disable() -> None:
    os.environ.pop(ENV, None)
    _state["on"] = False


def enabled() -> bool:
    return _state["on"]


def opened_names() -> set[str]:
    """Every range opened in this process so far."""
    return set(_names)


def phase_range(name: str):
    """A context manager that marks ``name`` in the profiler's trace and in NVTX (GPU), or a
    no-op when ranges are off."""
    return _Range(name) if _state["on"] else _NULL


class _Range:
    def __init__(self, name: str) -> None:
        self.name = name
        _names.add(name)

    def __enter__(self):
        import torch

        self._rf = torch.profiler.record_function(self.name)
        self._rf.__enter__()
        self._nvtx = torch.cuda.is_available()
        if self._nvtx:
            torch.cuda.nvtx.range_push(self.name)
        return self

    def __exit__(self, *exc):
        import torch

        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        self._rf.__exit__(*exc)
        return False


class PhaseTimes:
    """Wall seconds per phase of one step, as ``time_<phase>_s`` metrics. Phases nest and are
    exclusive: a phase's own time leaves out the phases timed inside it, so they add up to the
    step's time. Each phase is also a named range for a profile (``pc_megatron.phases``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []  # per open phase: time spent in phases nested inside it

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            with phase_range(phase):
                yield
        finally:
            dt = time.perf_counter() - t0
            own = dt - self._inner.pop()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + own
            if self._inner:
                self._inner[-1] += dt

    def carve(self, phase: str, part: str, seconds: float) -> None:
        """Move ``seconds`` of ``phase``'s time to ``part``: a sub-phase measured elsewhere (the
        learner times its optimizer step inside the ``train`` call)."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) - seconds
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        return {f"time_{k}_s": v for k, v in self.seconds.items()}

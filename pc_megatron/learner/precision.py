"""``learner.bf16: auto``: bf16 on CUDA; on a CPU, bf16 where the CPU has bf16 matrix instructions
(``amx_bf16`` or ``avx512_bf16`` in its flags) *and* a short matmul probe at a training shape shows
bf16 at least ``BF16_MIN_SPEEDUP`` times fp32's rate (a CPU without them runs bf16 emulated, slower
than fp32); fp32 anywhere else. Resolved when a run starts (``runtime/resources.py``), never when a
module loads."""

from __future__ import annotations

import functools
import time
from pathlib import Path

BF16_UNITS = ("amx_bf16", "avx512_bf16")
BF16_MIN_SPEEDUP = 1.5
"""bf16 is chosen on a CPU only when its matmul runs at least this many times fp32's rate."""


def cpu_bf16_units(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The bf16 matrix instructions this CPU reports (``BF16_UNITS`` found in its flags)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return [u for u in BF16_UNITS if u in flags]


@functools.lru_cache(maxsize=8)
def bf16_matmul_speedup(threads: int, budget_s: float = 0.15) -> float:
    """bf16 matmul rate over fp32's at a training shape (512x576x1536, SmolLM2-135M's MLP), with
    ``threads`` torch threads: each dtype timed for about ``budget_s`` after a warm-up (well under a
    second in all). Cached per process."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        rates = {}
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(512, 576).to(dtype)
            b = torch.randn(576, 1536).to(dtype)
            a @ b  # warm-up: oneDNN builds its kernel on the first call
            count, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < budget_s:
                a @ b
                count += 1
            rates[dtype] = count / elapsed
        return rates[torch.bfloat16] / rates[torch.float32]
    finally:
        torch.set_num_threads(before)


def resolve_bf16(setting: bool | str, threads: int) -> tuple[bool, str]:
    """``(bf16, why)`` for ``learner.bf16`` (``True``, ``False`` or ``"auto"``)."""
    if isinstance(setting, bool):
        return setting, "set"
    import torch

    if torch.cuda.is_available():
        return True, "CUDA"
    units = cpu_bf16_units()
    if not units:
        return False, f"this CPU reports no bf16 matrix instructions ({' or '.join(BF16_UNITS)})"
    speedup = bf16_matmul_speedup(threads)
    verdict = ">=" if speedup >= BF16_MIN_SPEEDUP else "<"
    return speedup >= BF16_MIN_SPEEDUP, (
        f"{'+'.join(units)}, bf16 matmul {speedup:.1f}x fp32 {verdict} {BF16_MIN_SPEEDUP}x"
    )

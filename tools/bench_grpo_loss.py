"""Benchmark the GRPO loss paths: time (forward, backward) and peak memory, appended to a CSV.

    python tools/bench_grpo_loss.py                          # GPU: T = 8k..64k, V = 152064, H = 5120
    TRITON_INTERPRET=1 python tools/bench_grpo_loss.py --device cpu --tokens 64 --vocab 1000 \\
        --hidden 32 --modes eager kernel fused_linear        # smoke test of this script on CPU

Modes (each from logits (T, V) bf16 unless noted):
  eager         kernels.grpo_loss reference (materialises float32 log-softmax)
  compile       torch.compile of the reference
  kernel        the Triton log-prob/entropy kernels
  fused_linear  from hidden (T, H) and weight (V, H): the logits never exist in full
  eager_linear  hidden @ weight.T then the eager reference (baseline for fused_linear)
  liger         Liger-Kernel's fused-linear GRPO loss, when it is installed

The logits-path bandwidth floor: forward reads the logits once, backward reads them and writes
their gradient, 3 * T * V * 2 bytes in all, divided by --peak-gbps (H200: 4800 GB/s).
Run the same shapes side by side in one process and report ratios (machines are noisy).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.grpo_loss import fused_linear_grpo_loss, grpo_loss


def commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def make_inputs(T, V, H, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = (torch.randn(T, H, generator=g) * 0.5).to(device, torch.bfloat16)
    weight = (torch.randn(V, H, generator=g) * H**-0.5).to(device, torch.bfloat16)
    targets = torch.randint(0, V, (T,), generator=g).to(device)
    old = (-torch.rand(T, generator=g) * 5).to(device)
    adv = torch.randn(T, generator=g).to(device)
    mask = (torch.rand(T, generator=g) > 0.1).float().to(device)
    return hidden, weight, targets, old, adv, mask


def runner(mode, hidden, weight, targets, old, adv, mask):
    """Return a zero-argument callable that runs forward and returns (loss, grad leaves)."""
    if mode in ("eager", "compile", "kernel"):
        logits = (hidden @ weight.T).detach()
        impl = "triton" if mode == "kernel" else "torch"

        def loss_fn(x):
            return grpo_loss(x, targets, old, adv, mask, impl=impl).loss

        if mode == "compile":
            loss_fn = torch.compile(loss_fn)

        def run():
            x = logits.clone().requires_grad_()
            return loss_fn(x), [x]

        return run
    if mode in ("fused_linear", "eager_linear"):

        def run():
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            if mode == "fused_linear":
                return fused_linear_grpo_loss(h, w, targets, old, adv, mask).loss, [h, w]
            return grpo_loss(h @ w.T, targets, old, adv, mask, impl="torch").loss, [h, w]

        return run
    if mode == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss  # optional dependency

        # Liger takes (B, L) sequences with one advantage per sequence: same tokens, reshaped.
        liger = LigerFusedLinearGRPOLoss(
            beta=0.0, use_ref_model=False, epsilon_low=0.2, epsilon_high=0.28, loss_type="dapo"
        )
        L = min(512, hidden.shape[0])
        B = hidden.shape[0] // L

        def run():
            h, w = hidden[: B * L].clone().requires_grad_(), weight.clone().requires_grad_()
            out = liger(
                h.view(B, L, -1),
                w,
                targets[: B * L].view(B, L),
                mask[: B * L].view(B, L),
                adv[:B],
                old_per_token_logps=old[: B * L].view(B, L),
            )
            return (out[0] if isinstance(out, tuple) else out), [h, w]

        return run
    raise ValueError(mode)


def measure(run, device, repeats):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loss, leaves = run()  # warm-up (compilation, autotuning)
    loss.backward()
    del loss, leaves
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    fwd, bwd = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        loss, leaves = run()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        del loss, leaves
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return 1e3 * sorted(fwd)[len(fwd) // 2], 1e3 * sorted(bwd)[len(bwd) // 2], peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--hidden", type=int, default=5120)
    modes = ["eager", "compile", "kernel", "eager_linear", "fused_linear", "liger"]
    ap.add_argument("--modes", nargs="+", default=modes)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peak-gbps", type=float, default=4800.0)
    ap.add_argument("--csv", default="benchmarks/grpo_loss.csv")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("this benchmark needs CUDA; for a CPU smoke test pass --device cpu with TRITON_INTERPRET=1")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (TRITON_INTERPRET)"
    out = Path(args.csv)
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(
                [
                    "device",
                    "commit",
                    "torch",
                    "mode",
                    "T",
                    "V",
                    "H",
                    "fwd_ms",
                    "bwd_ms",
                    "peak_gib",
                    "floor_ms",
                    "status",
                ]
            )
        for T in args.tokens:
            inputs = make_inputs(T, args.vocab, args.hidden, device)
            floor_ms = 3 * T * args.vocab * 2 / (args.peak_gbps * 1e9) * 1e3
            for mode in args.modes:
                status, fwd, bwd, peak = "ok", float("nan"), float("nan"), float("nan")
                try:
                    fwd, bwd, peak = measure(runner(mode, *inputs), device, args.repeats)
                except torch.OutOfMemoryError:
                    status = "oom"
                except ImportError as e:
                    status = f"not installed ({e.name})"
                except Exception as e:  # record and continue: one failing mode must not hide the rest
                    status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                row = [
                    name,
                    commit(),
                    torch.__version__,
                    mode,
                    T,
                    args.vocab,
                    args.hidden,
                    f"{fwd:.2f}",
                    f"{bwd:.2f}",
                    f"{peak:.2f}",
                    f"{floor_ms:.2f}",
                    status,
                ]
                w.writerow(row)
                f.flush()
                print(",".join(map(str, row)), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

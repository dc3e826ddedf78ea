"""Learner throughput: RL train-step tokens/s for a 1.5B-class random Qwen2 on one GPU, bf16
and bf16 + FP8 (Transformer Engine), side by side in one process.

    python tools/bench_learner.py [--fp8-recipe delayed] [--seq 1024] [--batch 8] [--steps 5]
    python tools/bench_learner.py --small      # CPU smoke test of the script itself

Qwen2.5-1.5B shapes: hidden 1536, 28 layers, 12 heads, 2 kv heads, FFN 8960, vocab 151936.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def write_random_qwen2(folder: Path, small: bool) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    shapes = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                  intermediate_size=8960, vocab_size=151936)  # fmt: skip
    if small:
        shapes = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=256, vocab_size=512)  # fmt: skip
    cfg = Qwen2Config(**shapes, max_position_embeddings=4096, tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(folder)


def run(folder: Path, fp8: str, recipe: str, seq: int, batch: int, steps: int) -> dict:
    from pc_megatron.algo import LossConfig
    from pc_megatron.learner import Learner, LearnerConfig, TokenBatch

    gpu = torch.cuda.is_available()
    cfg = LearnerConfig(bf16=gpu, fp8=fp8, fp8_recipe=recipe, micro_batch_size=batch, lr=1e-6)
    learner = Learner(folder, cfg, seed=0)
    vocab = learner.arch.vocab_size
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    data = TokenBatch(tokens.to(learner.device), torch.ones(batch, seq - 1, device=learner.device))
    adv = torch.linspace(-1, 1, batch, device=learner.device)
    old = learner.logprobs(data)
    learner.train_rl(data, old, adv, LossConfig(), 1.0)  # warm-up (TE autotuning, FP8 scales)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.train_rl(data, old, adv, LossConfig(), 1.0)
    if gpu:
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
    return {"step_s": dt, "tokens_per_s": batch * seq / dt, "peak_gib": peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8-recipe", default="delayed")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="tiny shapes, CPU: checks the script runs")
    args = ap.parse_args()
    if not args.small and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --small for a CPU smoke test)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2"
        write_random_qwen2(folder, args.small)
        modes = [""] if args.small else ["", "hybrid"]
        base = "bf16" if torch.cuda.is_available() else "fp32"
        rows = {m or base: run(folder, m, args.fp8_recipe, args.seq, args.batch, args.steps) for m in modes}
    print(f"seq {args.seq} x batch {args.batch}, {args.steps} timed steps (fp8 recipe {args.fp8_recipe})")
    print("| precision | step s | tokens/s | peak GiB |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['peak_gib']:.1f} |")
    if "hybrid" in rows:
        print(f"fp8 / bf16 tokens/s: {rows['hybrid']['tokens_per_s'] / rows['bf16']['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()

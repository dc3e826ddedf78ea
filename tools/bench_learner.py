"""Learner throughput: RL train-step and log-prob tokens/s for a 1.5B-class random Qwen2 on one GPU, bf16
and bf16 + FP8 (Transformer Engine), side by side in one process; also the learner side of a
weight sync (every HF-named tensor gathered: GB/s) and the optimizer state's trip to host memory
and back (Megatron-Core's offload_to_cpu against the learner's pinned buffers).

    python tools/bench_learner.py [--fp8-recipe delayed] [--seq 1024] [--batch 8] [--steps 5] [--impl local]
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


def run(folder: Path, fp8: str, recipe: str, seq: int, batch: int, steps: int, impl: str) -> dict:
    from pc_megatron.algo import LossConfig
    from pc_megatron.learner import Learner, LearnerConfig, TokenBatch

    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    cfg = LearnerConfig(
        bf16=gpu, fp8=fp8, fp8_recipe=recipe, micro_batch_size=batch, lr=1e-6, transformer_impl=impl,
    )  # fmt: skip
    learner = Learner(folder, cfg, seed=0)
    vocab = learner.arch.vocab_size
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    data = TokenBatch(tokens.to(learner.device), torch.ones(batch, seq - 1, device=learner.device))
    adv = torch.linspace(-1, 1, batch, device=learner.device)
    old = learner.logprobs(data)
    learner.train_rl(data, old, adv, LossConfig(), 1.0)  # warm-up (TE autotuning, FP8 scales)
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.train_rl(data, old, adv, LossConfig(), 1.0)
    sync()
    dt = (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else float("nan")
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.logprobs(data)
    sync()
    logprob_s = (time.perf_counter() - t0) / steps
    # the learner side of a weight sync: every HF-named tensor gathered and materialised
    t0, nbytes = time.perf_counter(), 0
    for _, t in learner.hf_named_tensors():
        nbytes += t.contiguous().numel() * t.element_size()
    sync()
    export_s = time.perf_counter() - t0
    # colocation: optimizer state to host and back, Megatron-Core's own offload_to_cpu against the
    # learner's pinned buffers (first call allocates them; the second is every later step)
    moves: dict[str, float] = {}
    if gpu:

        def timed(fn) -> float:
            sync()
            t = time.perf_counter()
            fn()
            sync()
            return time.perf_counter() - t

        opt, host = learner.optimizer, learner._host
        moves["megatron_offload_s"] = timed(opt.offload_to_cpu)
        moves["megatron_restore_s"] = timed(opt.restore_from_cpu)
        for k in ("first", "steady"):
            moves[f"pinned_{k}_offload_s"] = timed(lambda: host.offload(opt, learner.model.parameters()))
            moves[f"pinned_{k}_restore_s"] = timed(lambda: host.restore(opt))
        moves["state_gb"] = host.host_bytes / 1e9
        after = learner.train_rl(data, old, adv, LossConfig(), 1.0)  # still trains after the round trips
        moves["loss_after"] = float(after["loss"])
    return {
        "step_s": dt,
        "tokens_per_s": batch * seq / dt,
        "peak_gib": peak,
        "logprob_tokens_per_s": batch * seq / logprob_s,
        "export_gb_per_s": nbytes / export_s / 1e9,
        "export_gb": nbytes / 1e9,
        **moves,
    }


def main() -> None:
    import importlib.util
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8-recipe", default="delayed")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--impl", default="auto", help="learner.transformer_impl: auto, local, transformer_engine")
    ap.add_argument("--small", action="store_true", help="tiny shapes, CPU: checks the script runs")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not args.small and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --small for a CPU smoke test)")
    te = importlib.util.find_spec("transformer_engine") is not None
    modes = [""] if args.small else ["", "hybrid"]
    if "hybrid" in modes and not te:
        print("fp8: skipped (transformer_engine is not installed; FP8 GEMMs go through TE)")
        modes.remove("hybrid")
    base = "bf16" if torch.cuda.is_available() else "fp32"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "qwen2"
        write_random_qwen2(folder, args.small)
        rows = {m or base: run(folder, m, args.fp8_recipe, args.seq, args.batch, args.steps, args.impl) for m in modes}
    impl = args.impl if args.impl != "auto" else ("transformer_engine" if te and torch.cuda.is_available() else "local")
    print(f"seq {args.seq} x batch {args.batch}, {args.steps} timed steps, {impl} spec (fp8 recipe {args.fp8_recipe})")
    print("| precision | step s | train tokens/s | log-prob tokens/s | peak GiB | export GB/s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['logprob_tokens_per_s']:,.0f} | "
            f"{r['peak_gib']:.1f} | {r['export_gb_per_s']:.1f} ({r['export_gb']:.2f} GB) |"
        )
        if "state_gb" in r:
            print(
                f"optimizer state {r['state_gb']:.1f} GB to host / back: Megatron offload_to_cpu "
                f"{r['megatron_offload_s']:.2f} / {r['megatron_restore_s']:.2f} s; pinned, first "
                f"{r['pinned_first_offload_s']:.2f} / {r['pinned_first_restore_s']:.2f} s, steady "
                f"{r['pinned_steady_offload_s']:.2f} / {r['pinned_steady_restore_s']:.2f} s; "
                f"loss after {r['loss_after']:.4f}"
            )
    if "hybrid" in rows:
        print(f"fp8 / bf16 tokens/s: {rows['hybrid']['tokens_per_s'] / rows['bf16']['tokens_per_s']:.2f}x")
    if args.out:
        result = {"impl": impl, "seq": args.seq, "batch": args.batch, "rows": rows}
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

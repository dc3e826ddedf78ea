"""Learner throughput.

Dense (GPU): RL train-step and log-prob tokens/s for a 1.5B-class random Qwen2, bf16 and bf16 + FP8
(Transformer Engine), side by side in one process; also the learner side of a weight sync (every
HF-named tensor gathered: GB/s) and the optimizer state's trip to host memory and back
(Megatron-Core's offload_to_cpu against the learner's pinned buffers).

    python tools/bench_learner.py [--fp8-recipe delayed] [--seq 1024] [--batch 8] [--steps 5] [--impl local]
    python tools/bench_learner.py --small      # CPU smoke test of the script itself

Ragged (CPU or GPU): a batch of log-normal lengths through each micro-batch layout, every layout in
a fresh process (its own peak memory), the layouts taking turns round after round so that a drift
of the machine hits them alike; times per pass, tokens/s and ratios to ``equal`` (the same tokens as
equal-length rows), paired by round:

    python tools/bench_learner.py --ragged [--shape smollm2] [--rows 48] [--mu 4.3 --sigma 0.9]
        [--min-len 12 --max-len 768] [--budget 4096] [--rounds 3] [--out ragged.json]

Layouts: ``padded`` (fixed rows, one micro-batch padded to the longest row: the learner before token
budgets), ``budget`` (token-budget micro-batches, padded), ``packed`` (token-budget, THD streams),
``equal`` (rows of the mean length, one micro-batch: what the tokens cost without raggedness).
Lengths: ``clamp(exp(N(mu, sigma)), min, max)`` from a fixed seed, the longest row set to ``max``.

Qwen2.5-1.5B shapes: hidden 1536, 28 layers, 12 heads, 2 kv heads, FFN 8960, vocab 151936.
SmolLM2-135M (Llama): hidden 576, 30 layers, 9 heads, 3 kv heads, FFN 1536, vocab 49152, tied.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    "smollm2": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152),
    "qwen1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                     intermediate_size=8960, vocab_size=151936),
    "llama4x256": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=768, vocab_size=8192),
}  # fmt: skip
LAYOUTS = {
    "padded": lambda budget, rows: dict(max_tokens_per_micro_batch=0, micro_batch_size=rows, packing=False),
    "budget": lambda budget, rows: dict(max_tokens_per_micro_batch=budget, packing=False),
    "packed": lambda budget, rows: dict(max_tokens_per_micro_batch=budget, packing=True),
    "equal": lambda budget, rows: dict(max_tokens_per_micro_batch=0, micro_batch_size=rows, packing=False),
}


def random_model(folder: Path, shape: str, dtype: torch.dtype) -> Path:
    """A randomly initialised Llama of ``shape`` (tied embeddings) saved at ``folder``, once: the time
    of a pass does not depend on the weights' values."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=16384, tie_word_embeddings=True)
        AutoModelForCausalLM.from_config(cfg, dtype=dtype).save_pretrained(folder)
    return folder


def ragged_lengths(rows: int, mu: float, sigma: float, lo: int, hi: int) -> list[int]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.randn(rows, generator=g) * sigma + mu).round().clamp(lo, hi).long().tolist()
    lengths[0] = hi  # one long tail, always
    return lengths


def ragged_child(args) -> dict:
    """One layout in this process: a warm-up, then ``--steps`` log-prob passes and RL steps."""
    import resource

    from pc_megatron.algo.config import LossConfig
    from pc_megatron.batch import TokenBatch
    from pc_megatron.learner.config import LearnerConfig
    from pc_megatron.learner.learner import Learner

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    folder = random_model(Path(args.workdir) / args.shape, args.shape, dtype)
    lengths = ragged_lengths(args.rows, args.mu, args.sigma, args.min_len, args.max_len)
    if args.child == "equal":
        mean = round(sum(lengths) / len(lengths))
        lengths = [mean] * len(lengths)
    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    learner = Learner(folder, LearnerConfig(lr=1e-6, bf16=gpu, **LAYOUTS[args.child](args.budget, args.rows)), seed=0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros(len(lengths), max(lengths) - 1)
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.randint(0, SHAPES[args.shape]["vocab_size"], (n,), generator=g)
        mask[i, n // 4 : n - 1] = 1  # a prompt, then the trained response
    batch = TokenBatch(tokens, mask)
    adv = torch.linspace(-1, 1, len(lengths))
    old = learner.logprobs(batch)
    learner.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0)  # warm-up
    learner.take_pass_stats()
    sync()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        learner.logprobs(batch)
    sync()
    logprob_s = (time.perf_counter() - t0) / args.steps
    t0 = time.perf_counter()
    for _ in range(args.steps):
        learner.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0)
    sync()
    train_s = (time.perf_counter() - t0) / args.steps
    passes = learner.take_pass_stats()["train"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {
        "layout": args.child,
        "tokens": sum(lengths),
        "processed": passes["processed"] / passes["passes"],
        "micro_batches": passes["micro_batches"] / passes["passes"],
        "logprob_s": logprob_s,
        "train_s": train_s,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else rss,
        "peak_rise_gib": float("nan") if gpu else rss - rss0 / 2**20,
    }


def ragged(args) -> None:
    import subprocess
    import sys
    import tempfile

    lengths = ragged_lengths(args.rows, args.mu, args.sigma, args.min_len, args.max_len)
    print(
        f"{args.shape}: {args.rows} rows, lengths {min(lengths)}-{max(lengths)} "
        f"(mean {sum(lengths) / len(lengths):.0f}, "
        f"log-normal mu {args.mu} sigma {args.sigma}), budget {args.budget} tokens, {args.rounds} rounds of "
        f"{args.steps} passes, {args.threads} threads",
        flush=True,
    )
    layouts = args.layouts.split(",")
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or tmp
        for r in range(args.rounds):
            row = {}
            for layout in layouts:
                cmd = [sys.executable, __file__, "--child", layout, "--workdir", workdir, *sys.argv[1:]]
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if out.returncode:
                    raise SystemExit(f"{layout}: {out.stderr[-3000:]}")
                row[layout] = json.loads(out.stdout.strip().splitlines()[-1])
                res = row[layout]
                print(
                    f"round {r} {layout:7s} logprob {res['logprob_s']:.3f} s  train {res['train_s']:.3f} s  "
                    f"processed {res['processed']:,.0f} / {res['tokens']:,} tokens",
                    flush=True,
                )
            rounds.append(row)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print("\n| layout | processed / real | micro-batches | log-prob s | train s | log-prob tok/s | train tok/s | "
          "log-prob x equal | train x equal | peak GiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for layout in layouts:
        runs = [row[layout] for row in rounds]
        x = {
            k: med([r[k] / row["equal"][k] for r, row in zip(runs, rounds, strict=True)]) if "equal" in layouts else 0
            for k in ("logprob_s", "train_s")
        }
        lp, tr = med([r["logprob_s"] for r in runs]), med([r["train_s"] for r in runs])
        summary[layout] = {
            "logprob_s": lp,
            "train_s": tr,
            "logprob_x_equal": x["logprob_s"],
            "train_x_equal": x["train_s"],
            **{k: runs[0][k] for k in ("tokens", "processed", "micro_batches")},
            "peak_gib": max(r["peak_gib"] for r in runs),
        }
        tok = runs[0]["tokens"]
        print(
            f"| {layout} | {runs[0]['processed'] / tok:.2f} | {runs[0]['micro_batches']:.0f} | {lp:.3f} | {tr:.3f} | "
            f"{tok / lp:,.0f} | {tok / tr:,.0f} | {x['logprob_s']:.2f} | {x['train_s']:.2f} | "
            f"{summary[layout]['peak_gib']:.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "lengths": lengths, "summary": summary,
                                              "rounds": rounds}, indent=2))  # fmt: skip


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
    from pc_megatron.algo.config import LossConfig
    from pc_megatron.batch import TokenBatch
    from pc_megatron.learner.config import LearnerConfig
    from pc_megatron.learner.learner import Learner

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
    learner.train_rl(data, old, adv, LossConfig(correction="none"), 1.0)  # warm-up (TE autotuning, FP8 scales)
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.train_rl(data, old, adv, LossConfig(correction="none"), 1.0)
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
        after = learner.train_rl(
            data, old, adv, LossConfig(correction="none"), 1.0
        )  # still trains after the round trips
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

    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8-recipe", default="delayed")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--impl", default="auto", help="learner.transformer_impl: auto, local, transformer_engine")
    ap.add_argument("--small", action="store_true", help="tiny shapes, CPU: checks the script runs")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--ragged", action="store_true", help="the micro-batch layouts on a ragged batch")
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--mu", type=float, default=4.3)
    ap.add_argument("--sigma", type=float, default=0.9)
    ap.add_argument("--min-len", type=int, default=12)
    ap.add_argument("--max-len", type=int, default=768)
    ap.add_argument("--budget", type=int, default=4096, help="learner.max_tokens_per_micro_batch of budget/packed")
    ap.add_argument("--layouts", default="padded,budget,packed,equal")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(ragged_child(args)))
        return
    if args.ragged:
        ragged(args)
        return
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

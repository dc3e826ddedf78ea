"""vLLM's CPU engine against this machine's limits: decode tokens/s of a model folder at several engine
settings, beside two bounds measured here and now,

- the matrix-unit bound: FLOPs of one decode step (2 x the parameters each token multiplies, the
  tied output layer included) over the measured matmul rate at the decode shape, in the engine's dtype;
- the memory bound: bytes read by one decode step (every weight once, the KV cache of every sequence)
  over the measured copy bandwidth,

each as tokens/s for a batch of ``--prompts`` sequences. Each engine setting runs in a process of its
own (its thread binding is read when vLLM's workers start), one after the other.

    python tools/decode_bench.py --model ~/.cache/pc-megatron/fixtures/smollm2-135m-instruct \\
        --out docs/results/decode_bench.md \\
        --setting "fp32, vLLM's binding:dtype=float32" \\
        --setting "bf16, both cores:dtype=bfloat16,bind=all"

A setting is ``LABEL:key=value,...`` with keys ``dtype`` (float32 | bfloat16), ``bind`` (``vllm``:
vLLM's own ``auto``, which keeps a core for its scheduler; ``all``: every core of this process),
``eager`` (1 | 0: vLLM's compiled CPU path) and ``seqs`` (max_num_seqs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TOKENS = 48


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    label, _, spec = text.rpartition(":")
    opts = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    return label, opts


def engine_run(model: str, opts: dict[str, str], prompts: int, tokens: int) -> dict:
    """Start vLLM with ``opts`` in this process and time one generate call (run as a child)."""
    from vllm import LLM, SamplingParams

    cores = sorted(os.sched_getaffinity(0))
    if opts.get("bind", "vllm") == "all":
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    t0 = time.perf_counter()
    llm = LLM(
        model=model,
        dtype=opts.get("dtype", "bfloat16"),
        enforce_eager=opts.get("eager", "1") == "1",
        max_num_seqs=int(opts.get("seqs", 64)),
        max_model_len=512,
        kv_cache_memory_bytes=1 << 30,
        enable_chunked_prefill=False,
        skip_tokenizer_init=True,
        seed=0,
        disable_log_stats=True,
    )
    start_s = time.perf_counter() - t0
    reqs = [{"prompt_token_ids": [100 + (i * 7 + j) % 20000 for j in range(PROMPT_TOKENS)]} for i in range(prompts)]
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0, seed=0)
    llm.generate(reqs[:4], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(reqs, params, use_tqdm=False)
    gen_s = time.perf_counter() - t0
    made = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"start_s": start_s, "generate_s": gen_s, "tokens": made, "tok_per_s": made / gen_s}


def matmul_rate(dtype, m: int, k: int, n: int, threads: int, budget_s: float = 0.5) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < budget_s:
        a @ b
        count += 1
    return 2 * m * k * n * count / (time.perf_counter() - t0)


def copy_bandwidth(threads: int, size_bytes: int = 512 << 20) -> float:
    """Bytes moved per second (read + write) copying a buffer far larger than the caches."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(size_bytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        dst.copy_(src)
        count += 1
    return 2 * size_bytes * count / (time.perf_counter() - t0)


def bounds(model: Path, prompts: int, tokens: int, dtype_name: str) -> dict:
    import torch

    cfg = json.loads((model / "config.json").read_text())
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or h // heads
    per_layer = h * (heads * head_dim) + 2 * h * (kv_heads * head_dim) + (heads * head_dim) * h + 3 * h * inter
    multiplied = layers * per_layer + vocab * h  # the output layer multiplies every token too
    dtype = torch.bfloat16 if dtype_name == "bfloat16" else torch.float32
    width = 2 if dtype == torch.bfloat16 else 4
    threads = len(os.sched_getaffinity(0))
    rate = matmul_rate(dtype, prompts, h, inter, threads)
    bandwidth = copy_bandwidth(threads)
    mean_ctx = PROMPT_TOKENS + tokens / 2
    kv_bytes = prompts * mean_ctx * layers * 2 * kv_heads * head_dim * width
    step_bytes = multiplied * width + kv_bytes
    return {
        "dtype": dtype_name,
        "flops_per_token": 2 * multiplied,
        "matmul_flops_per_s": rate,
        "bandwidth_bytes_per_s": bandwidth,
        "step_bytes": step_bytes,
        "matrix_bound_tok_per_s": rate / (2 * multiplied),
        "memory_bound_tok_per_s": prompts * bandwidth / step_bytes,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--setting", action="append", default=[])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(engine_run(args.model, json.loads(args.child), args.prompts, args.tokens)))
        return 0
    model = Path(args.model).expanduser()
    lines = [
        f"Model `{model.name}`, {args.prompts} prompts x {args.tokens} new tokens (ignore_eos), "
        f"{len(os.sched_getaffinity(0))} cores.",
        "",
        "| bound | dtype | FLOPs/token | matmul rate | bandwidth | bytes/step | tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    measured_bounds = {}
    for dtype in ("float32", "bfloat16"):
        b = measured_bounds[dtype] = bounds(model, args.prompts, args.tokens, dtype)
        common = (
            f"| {dtype} | {b['flops_per_token'] / 1e6:.0f} M | {b['matmul_flops_per_s'] / 1e9:.0f} GFLOP/s | "
            f"{b['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s | {b['step_bytes'] / 1e6:.0f} MB"
        )
        lines.append(f"| matrix units {common} | {b['matrix_bound_tok_per_s']:.0f} |")
        lines.append(f"| memory {common} | {b['memory_bound_tok_per_s']:.0f} |")
    lines += [
        "",
        "| setting | start | tok/s | of the matrix bound | of the memory bound |",
        "|---|---|---|---|---|",
    ]
    results = {}
    for setting in args.setting:
        label, opts = parse_setting(setting)
        cmd = [sys.executable, __file__, "--model", str(model), "--child", json.dumps(opts)]
        cmd += ["--prompts", str(args.prompts), "--tokens", str(args.tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
        found = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not found:
            lines.append(f"| {label} | failed: {(out.stderr.strip().splitlines() or ['?'])[-1][:200]} | | | |")
            continue
        r = results[label] = json.loads(found[0][7:])
        b = measured_bounds[opts.get("dtype", "bfloat16")]
        lines.append(
            f"| {label} (`{setting.rpartition(':')[2]}`) | {r['start_s']:.0f} s | {r['tok_per_s']:.0f} | "
            f"{r['tok_per_s'] / b['matrix_bound_tok_per_s']:.0%} | {r['tok_per_s'] / b['memory_bound_tok_per_s']:.0%} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"bounds": measured_bounds, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

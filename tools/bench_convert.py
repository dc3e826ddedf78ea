"""Conversion throughput and peak memory, both directions, on a random >= 1B-parameter model.

    python tools/bench_convert.py [--workdir /tmp/pcm-bench] [--tp 2] [--pp 1] [--layers 22]
    python tools/bench_convert.py --checkpoint     # also: training checkpoint (learner) -> HF

Writes a random Llama-style HF folder (TinyLlama-1.1B shapes: hidden 2048, 22 layers, 32 heads,
4 kv heads, FFN 5632, vocab 32000, bf16, 4 files; written layer by layer), then times
``pc-megatron convert --to megatron --tp N`` and ``--to hf`` in fresh processes, reading each
one's peak RSS from ``/usr/bin/time -v``, and checks that the round trip is bit-identical.

``--checkpoint`` builds the learner from the HF folder in one process (fp32, TP=1), saves its
Megatron distributed checkpoint as a training run would, and times ``--to hf`` on that
checkpoint (read one layer at a time), checking it against the HF weights (bf16 -> fp32 ->
bf16 is exact).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_random_model(folder: Path, layers: int) -> int:
    hidden, heads, kv, ffn, vocab, d = 2048, 32, 4, 5632, 32000, 64
    folder.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": ffn, "vocab_size": vocab, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    groups = [list(range(i, layers, 4)) for i in range(4)]
    weight_map, total = {}, 0
    for part, idx in enumerate(groups):
        tensors = {}
        if part == 0:
            tensors["model.embed_tokens.weight"] = rand(vocab, hidden)
            tensors["lm_head.weight"] = rand(vocab, hidden)
            tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        for i in idx:
            p = f"model.layers.{i}."
            tensors |= {
                p + "self_attn.q_proj.weight": rand(heads * d, hidden),
                p + "self_attn.k_proj.weight": rand(kv * d, hidden),
                p + "self_attn.v_proj.weight": rand(kv * d, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * d),
                p + "mlp.gate_proj.weight": rand(ffn, hidden),
                p + "mlp.up_proj.weight": rand(ffn, hidden),
                p + "mlp.down_proj.weight": rand(hidden, ffn),
                p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            }
        name = f"model-{part + 1:05d}-of-00004.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
        total += sum(t.numel() for t in tensors.values())
        del tensors
    index = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


def timed_convert(args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS GiB) of one `pc-megatron convert` process."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "pc_megatron.cli", "convert", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    return seconds, rss_kb / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/pcm-bench")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--checkpoint", action="store_true", help="also time training checkpoint -> HF")
    ap.add_argument("--max-shard-gb", default="2.0", help="largest HF output file")
    args = ap.parse_args()
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    params = write_random_model(work / "hf", args.layers)
    size = sum(f.stat().st_size for f in (work / "hf").glob("*.safetensors"))
    print(f"random model: {params / 1e9:.3f} B parameters, {size / 1e9:.2f} GB bf16 ({time.perf_counter() - t0:.0f} s)")
    layout = f"TP={args.tp}" + (f" PP={args.pp}" if args.pp > 1 else "")
    s1, m1 = timed_convert(
        ["--to", "megatron", str(work / "hf"), str(work / "mg"), "--tp", str(args.tp), "--pp", str(args.pp)]
    )
    s2, m2 = timed_convert(["--to", "hf", str(work / "mg"), str(work / "back"), "--max-shard-gb", args.max_shard_gb])
    print("| direction | seconds | GB/s | peak RSS GiB | model GB |")
    print("|---|---|---|---|---|")
    print(f"| HF -> Megatron {layout} | {s1:.1f} | {size / 1e9 / s1:.2f} | {m1:.2f} | {size / 1e9:.2f} |")
    back = f"Megatron {layout} -> HF (files <= {args.max_shard_gb} GB)"
    print(f"| {back} | {s2:.1f} | {size / 1e9 / s2:.2f} | {m2:.2f} | {size / 1e9:.2f} |")
    from pc_megatron.weight_sync.sharding import HFTensors

    a, b = HFTensors(work / "hf"), HFTensors(work / "back")
    assert set(a.where) == set(b.where), "round trip lost or added tensors"
    for key in a.where:
        assert torch.equal(a.read(key), b.read(key)), key
    print(f"round trip bit-identical: {len(a.where)} tensors")
    if args.checkpoint:
        bench_checkpoint(work, args.max_shard_gb)
    shutil.rmtree(work, ignore_errors=True)


SAVE_CHECKPOINT = """
import sys, torch
from pathlib import Path
from pc_megatron.checkpoint.store import save_checkpoint
from pc_megatron.learner.learner import Learner
from pc_megatron.learner.config import LearnerConfig
torch.set_num_threads(2)
hf, run = Path(sys.argv[1]), Path(sys.argv[2])
learner = Learner(hf, LearnerConfig(), seed=0)
save_checkpoint(run / "checkpoints", 1, {}, keep_last=1, hf_side=hf, learner=learner)
"""


def bench_checkpoint(work: Path, max_shard_gb: str) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", SAVE_CHECKPOINT, str(work / "hf"), str(work / "run")])
    if proc.returncode != 0:
        raise SystemExit("building and saving the learner failed")
    learner_dir = work / "run" / "checkpoints" / "step_000001" / "learner"
    ckpt = sum(f.stat().st_size for f in learner_dir.glob("*.distcp"))
    print(f"learner checkpoint (fp32, no optimizer state yet): {ckpt / 1e9:.2f} GB ({time.perf_counter() - t0:.0f} s)")
    s, m = timed_convert(["--to", "hf", str(work / "run"), str(work / "from-ckpt"), "--max-shard-gb", max_shard_gb])
    print("| direction | seconds | GB/s (read) | peak RSS GiB | checkpoint GB |")
    print("|---|---|---|---|---|")
    print(f"| training checkpoint -> HF | {s:.1f} | {ckpt / 1e9 / s:.2f} | {m:.2f} | {ckpt / 1e9:.2f} |")
    from pc_megatron.weight_sync.sharding import HFTensors

    a, b = HFTensors(work / "hf"), HFTensors(work / "from-ckpt")
    assert set(a.where) == set(b.where), "export lost or added tensors"
    for key in a.where:
        assert torch.equal(a.read(key).float(), b.read(key)), key
    print(f"checkpoint export equals the HF weights: {len(a.where)} tensors")


if __name__ == "__main__":
    main()

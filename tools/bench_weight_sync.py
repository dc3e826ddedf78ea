"""Weight-sync throughput into the vLLM engine, and rollout throughput of the hf and vllm engines.

    python tools/bench_weight_sync.py [--workdir /tmp/pcm-bench-sync] [--buckets 16 64 256 1024]
                                      [--skip-large] [--repeats 3] [--out results.json]
                                      [--skip-sync] [--skip-rollout] [--transports shm bytes broadcast]
                                      [--receivers 2] [--transport-bucket 256]

1. **Sync**: seconds and GB/s of ``VllmEngine.update_weights`` (learner-side pack, transport,
   engine-side layerwise reload, manifest check, version handshake) for the shipped tiny policy
   and for a random Qwen2.5-0.5B-shaped model (494M parameters, head_dim 64 so the CPU backend
   takes it; fp32 on CPU, bf16 on GPU), at each bucket size. The tensors are already in host
   (CPU) or device (GPU) memory, as the learner's gathered tensors are. Median of ``--repeats``.
   On GPU the script also projects a 14B (bf16, 29.5 GB) colocated sync from the best GB/s.
2. **Transports** (``--transports``): GB/s of ``push_weights`` from this process into
   ``--receivers`` receiver processes per transport, side by side on the same tensors and bucket
   size: pack, move, and each receiver's copy-out (``BucketReceiver.open``, synchronised before
   it answers, so a GB/s counts bytes that arrived), no engine. The first, untimed sync of each
   section sends checksums and every receiver checks its copies against them. Calls
   reach the receivers over a multiprocessing queue (standing in for Ray's RPC; ``bytes``
   buckets travel through it, as they travel through Ray's object store). ``broadcast`` runs
   over gloo on CPU, NCCL on GPU (the receivers then take GPUs 1..R; on one GPU the receivers
   share it and broadcast is skipped). Prints each transport's GB/s over shm's and bytes'.
3. **Rollout**: generated tokens/s of the ``hf`` and ``vllm`` engines on the tiny recipe's
   rollout (64 prompts x 8 samples, temperature 1, up to 8 new tokens), the two engines
   interleaved ``--repeats`` times so machine noise hits both alike; the ratio is the figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from pc_megatron.rollout.config import RolloutConfig, SamplingParams, VllmConfig
from pc_megatron.weight_sync.config import WeightSyncConfig

QWEN05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}
GB_14B_BF16 = 14.77e9 * 2 / 1e9  # Qwen2.5-14B parameters x 2 bytes


def random_qwen(folder: Path, dtype: torch.dtype) -> Path:
    """A random Qwen2.5-0.5B-shaped HF folder (tied embeddings, like the real one)."""
    if (folder / "model.safetensors").is_file():
        return folder
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pc_megatron.embedded.tiny_model import build_tokenizer

    cfg = Qwen2Config(**QWEN05B, max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=1)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def bench_sync(model_dir: Path, buckets_mb: list[int], repeats: int, on_gpu: bool) -> list[dict]:
    from pc_megatron.rollout.vllm_engine import VllmEngine
    from pc_megatron.weight_sync.sharding import HFTensors

    rows = []
    hf = HFTensors(model_dir)
    device = "cuda" if on_gpu else "cpu"
    for mb in buckets_mb:
        cfg = RolloutConfig(
            backend="vllm",
            vllm=VllmConfig(max_num_seqs=16, cpu_kv_cache_gb=0.25, gpu_memory_utilization=0.3),
            weight_sync=WeightSyncConfig(bucket_mb=mb),
        )
        engine = VllmEngine(model_dir, cfg, learner_bf16=on_gpu)
        tensors = {k: hf.read(k).to(device=device, dtype=engine.dtype) for k in hf.where}
        times, stats = [], {}
        for r in range(repeats + 1):  # the first sync warms the buffers up and is not counted
            engine.sender.verify = r == 0  # ... and checks every bucket's bytes on arrival (checksums)
            stats = engine.update_weights(tensors.items(), version=r + 1)
            if r:
                times.append(stats["weight_sync_s"])
        engine.close()
        del tensors
        s = statistics.median(times)
        rows.append(
            {
                "model": model_dir.name,
                "bucket_mb": mb,
                "bytes": int(stats["weight_sync_bytes"]),
                "sync_s": s,
                "gb_per_s": stats["weight_sync_bytes"] / s / 1e9,
                "transport": engine.sender.kind,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _receiver_process(requests, answers, device: str) -> None:
    """A receiving process: copies every bucket out (as an engine would) and counts the tensors."""
    from pc_megatron.weight_sync.receiver import BucketReceiver

    torch.set_num_threads(1)
    receiver, received = BucketReceiver(device), 0
    while True:
        call, *args = requests.get()
        try:
            if call == "stop":
                receiver.leave()
                return
            if call == "join":
                answer = receiver.join(*args)
            elif call == "begin":
                received, answer = 0, None
            elif call == "load":
                received += len(receiver.open(args[0]))
                answer = received
            else:  # "end"
                receiver.close()
                answer = args[0] if args[0] >= 0 and received == args[1] else None
        except Exception as e:
            answer = RuntimeError(f"{type(e).__name__}: {e}")
        answers.put(answer)


class _Receiver:
    """A receiver process as a (collective) sync target; calls and answers go over queues."""

    def __init__(self, ctx, device: str) -> None:
        self.requests, self.answers = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_receiver_process, args=(self.requests, self.answers, device), daemon=True)
        self.proc.start()

    def call(self, *message):
        self.requests.put(message)
        return self.finish_load(None)

    def begin_sync(self) -> None:
        self.call("begin")

    def start_load(self, handle: dict) -> None:
        self.requests.put(("load", handle))

    def finish_load(self, pending: None):
        got = self.answers.get(timeout=600)
        if isinstance(got, BaseException):
            raise got
        return got

    def load_bucket(self, handle: dict) -> int:
        return self.call("load", handle)

    def end_sync(self, version: int, sent: int) -> int | None:
        return self.call("end", version, sent)

    def stop(self) -> None:
        self.requests.put(("stop",))
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()


def bench_transports(
    model_dir: Path, kinds: list[str], bucket_mb: int, receivers: int, repeats: int, on_gpu: bool
) -> list[dict]:
    import torch.multiprocessing as mp

    from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
    from pc_megatron.weight_sync.manifest import Manifest
    from pc_megatron.weight_sync.sharding import HFTensors
    from pc_megatron.weight_sync.transport import make_sender, push_weights

    hf = HFTensors(model_dir)
    device = "cuda" if on_gpu else "cpu"
    tensors = {k: hf.read(k).to(device) for k in hf.where}
    hf.release()
    manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in tensors.items()})
    ctx = mp.get_context("spawn")
    # NCCL takes one process per GPU: receivers get GPUs 1..R when there are that many; on a
    # single GPU they share cuda:0 with the sender (the colocated case) and broadcast is skipped.
    own_gpus = on_gpu and torch.cuda.device_count() > receivers
    if on_gpu and not own_gpus and "broadcast" in kinds:
        print(f"broadcast: skipped (NCCL needs {receivers + 1} GPUs, {torch.cuda.device_count()} visible)", flush=True)
        kinds = [k for k in kinds if k != "broadcast"]
    devices = [f"cuda:{i + 1}" if own_gpus else ("cuda:0" if on_gpu else "cpu") for i in range(receivers)]
    procs = [_Receiver(ctx, d) for d in devices]
    rows = []
    try:
        for kind in kinds:
            group = None
            if kind == "broadcast":
                group = BroadcastGroup.create("127.0.0.1", receivers, timeout_s=600, device=device)
                for rank, proc in enumerate(procs, start=1):
                    proc.requests.put(("join", group.info, rank))
                group.connect()
                for proc in procs:
                    proc.finish_load(None)
            sender = make_sender(kind, bucket_mb << 20, group)
            times, stats = [], {}
            for r in range(repeats + 1):  # the first sync warms the buffers up and is not counted
                sender.verify = r == 0  # ... and checks every bucket's bytes on arrival (checksums)
                stats = push_weights(tensors.items(), manifest, sender, procs, version=r + 1)
                if r:
                    times.append(stats["weight_sync_s"])
            sender.close()
            if group is not None:
                group.close()
            s = statistics.median(times)
            rows.append(
                {
                    "model": model_dir.name,
                    "transport": kind,
                    "receivers": receivers,
                    "bucket_mb": bucket_mb,
                    "bytes": int(stats["weight_sync_bytes"]),
                    "sync_s": s,
                    "gb_per_s": stats["weight_sync_bytes"] / s / 1e9,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for proc in procs:
            proc.stop()
    rate = {r["transport"]: r["gb_per_s"] for r in rows}
    for base in ("shm", "bytes"):
        if base in rate:
            ratios = {f"{k}_over_{base}": v / rate[base] for k, v in rate.items() if k != base}
            print(json.dumps({"model": model_dir.name, **ratios}), flush=True)
    return rows


def bench_rollout(repeats: int) -> dict:

    from pc_megatron.config import load_config
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.rollout.engines import build_engine
    from pc_megatron.run.prepare import load_task, warm_started

    cfg = load_config("tiny", ["progress=false"])
    task = load_task(cfg)
    policy = warm_started(cfg, task.sft, progress=False)
    tok = load_tokenizer(policy)
    prompts = [tok(r.prompt, add_special_tokens=False)["input_ids"] for r in task.train[:64]]
    params = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    engines = {}
    for backend in ("hf", "vllm"):
        rc = cfg.rollout
        rc.backend = backend
        rc.vllm.cpu_kv_cache_gb = 0.25
        engines[backend] = build_engine(rc, policy)
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    for r in range(repeats + 1):
        for backend, engine in engines.items():
            t0 = time.perf_counter()
            out = engine.generate(prompts, 8, params, seed=r)
            dt = time.perf_counter() - t0
            if r:  # the first call warms up
                rates[backend].append(sum(len(c.token_ids) for c in out) / dt)
    for e in engines.values():
        e.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    row = {"hf_tokens_per_s": med["hf"], "vllm_tokens_per_s": med["vllm"], "vllm_over_hf": med["vllm"] / med["hf"]}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/pcm-bench-sync")
    ap.add_argument("--buckets", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="only the tiny policy")
    ap.add_argument("--skip-rollout", action="store_true")
    ap.add_argument("--skip-sync", action="store_true", help="no vLLM engine sync section")
    ap.add_argument(
        "--transports",
        nargs="*",
        default=[],
        choices=["shm", "bytes", "broadcast", "cuda_ipc"],
        help="time these transports side by side into --receivers processes (no engine)",
    )
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--transport-bucket", type=int, default=256, help="bucket size (MB) of the transport section")
    ap.add_argument("--out", help="write all rows as JSON here")
    args = ap.parse_args()
    on_gpu = torch.cuda.is_available()
    from pc_megatron.warmstart import SHIPPED

    tiny = next(p for p in sorted(SHIPPED.iterdir()) if (p / "model.safetensors").is_file())
    result: dict = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "sync": []}
    big = None
    if not args.skip_large:
        big = random_qwen(Path(args.workdir) / "qwen2.5-0.5b-random", torch.bfloat16 if on_gpu else torch.float32)
    if args.transports:
        result["transports"] = [
            row
            for model in (tiny, big)
            if model is not None
            for row in bench_transports(
                model, args.transports, args.transport_bucket, args.receivers, args.repeats, on_gpu
            )
        ]
    if not args.skip_sync:
        result["sync"] += bench_sync(tiny, args.buckets[:2], args.repeats, on_gpu)
    if big is not None and not args.skip_sync:
        result["sync"] += bench_sync(big, args.buckets, args.repeats, on_gpu)
        if on_gpu:  # the colocated GPU path is what a 14B run uses
            best = max(r["gb_per_s"] for r in result["sync"] if r["model"] == big.name)
            result["projected_14b_sync_s"] = GB_14B_BF16 / best
            print(f"projected 14B bf16 sync at {best:.2f} GB/s: {result['projected_14b_sync_s']:.2f} s", flush=True)
    if not args.skip_rollout:
        result["rollout"] = bench_rollout(args.repeats)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

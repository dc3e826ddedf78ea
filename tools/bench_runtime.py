"""Step time of runtime=local against runtime=ray on the tiny recipe, side by side.

    python tools/bench_runtime.py [--steps 12] [--repeats 2] [--backend hf] [key=value ...]

Runs the recipe for ``--steps`` steps under each runtime, alternating (local, ray, local, ray,
...) so machine noise hits both alike, and reports per runtime the median step time (first two
steps excluded: start-up), the median of each phase, and the weight-sync seconds and GB/s
(in process for local; learner actor -> engine actor through shared memory for ray). The ratio
ray/local is Ray's overhead on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from pc_megatron.config import load_config
from pc_megatron.observability import read_metrics
from pc_megatron.train import train


def run(runtime: str, steps: int, backend: str, extra: list[str], out: Path) -> dict:
    cfg = load_config(
        "tiny",
        [
            f"steps={steps}",
            f"runtime={runtime}",
            f"rollout.backend={backend}",
            "progress=false",
            "eval.every_steps=1000",
            "checkpoint.every_steps=0",
            *extra,
        ],
    )
    train(cfg, out)
    rows = [r for r in read_metrics(out) if "time_step_s" in r][2:]
    phases = sorted({k for r in rows for k in r if k.startswith("time_") and k not in ("time_step_s", "time_eval_s")})
    return {
        "step_s": statistics.median(r["time_step_s"] for r in rows),
        **{p: statistics.median(r.get(p, 0.0) for r in rows) for p in phases},
        "sync_s": statistics.median(r["weight_sync_s"] for r in rows),
        "sync_gbps": statistics.median(r["weight_sync_gbps"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", default="hf")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    results: dict[str, list[dict]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="pcm-bench-rt-") as tmp:
        for r in range(args.repeats):
            for runtime in ("local", "ray"):
                res = run(runtime, args.steps, args.backend, args.overrides, Path(tmp) / f"{runtime}-{r}")
                results[runtime].append(res)
                print(json.dumps({"runtime": runtime, "repeat": r, **res}), flush=True)
    med = {rt: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for rt, rs in results.items()}
    print(json.dumps({"median": med, "ray_over_local_step": med["ray"]["step_s"] / med["local"]["step_s"]}, indent=2))


if __name__ == "__main__":
    main()

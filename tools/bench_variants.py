"""Step time of recipe variants, side by side: each variant is a name and its overrides.

    python tools/bench_variants.py [--recipe tiny] [--steps 12] [--repeats 2] \
        NAME=key=value[,key=value...] NAME=... [-- key=value ...common overrides]

    python tools/bench_variants.py local=runtime=local ray=runtime=ray
    python tools/bench_variants.py fused=algo.old_logprobs=fused separate=algo.old_logprobs=separate
    # the same run from another source tree, or with an environment variable set
    python tools/bench_variants.py before= after= ranges= --tree before=/tmp/before \
        --env ranges=PC_MEGATRON_PHASE_RANGES=1

Runs every variant (each in a fresh process) for ``--steps`` steps, alternating (a, b, a, b,
...) so machine noise hits all alike, and reports per variant the median step time (first two
steps excluded: start-up; steps with an evaluation too), the median of each phase and the
weight-sync seconds and GB/s; then each variant's step time
as a ratio to the first one's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pc_megatron.config import load_config
from pc_megatron.run.logs import read_metrics
from pc_megatron.train import train


def run(recipe: str, overrides: list[str], steps: int, out: Path) -> dict:
    fixed = [f"steps={steps}", "progress=false", "eval.every_steps=1000", "checkpoint.every_steps=0"]
    train(load_config(recipe, [*fixed, *overrides]), out)
    rows = [r for r in read_metrics(out) if "time_step_s" in r and "time_eval_s" not in r][2:]  # no eval steps
    phases = sorted({k for r in rows for k in r if k.startswith("time_") and k not in ("time_step_s", "time_eval_s")})
    return {
        "step_s": statistics.median(r["time_step_s"] for r in rows),
        **{p: statistics.median(r.get(p, 0.0) for r in rows) for p in phases},
        "sync_s": statistics.median(r["weight_sync_s"] for r in rows),
        "sync_gbps": statistics.median(r["weight_sync_gbps"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("variants", nargs="*", help="NAME=key=value[,key=value...]")
    ap.add_argument("--common", nargs="*", default=[], help="overrides for every variant")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH: run variant NAME from that source tree")
    ap.add_argument("--env", action="append", default=[], help="NAME=KEY=VALUE: set KEY for variant NAME")
    ap.add_argument("--one", nargs=3, metavar=("RECIPE", "STEPS", "OUT"), help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.one:  # a child: one run, its figures as the last line
        recipe, steps, out = args.one
        print(json.dumps(run(recipe, [*args.variants, *rest], int(steps), Path(out))))
        return
    variants = {}
    for v in args.variants:
        name, _, spec = v.partition("=")
        variants[name] = [s for s in spec.split(",") if s]
    trees = dict(t.split("=", 1) for t in args.tree)
    envs: dict[str, dict[str, str]] = {}
    for e in args.env:
        name, kv = e.split("=", 1)
        envs.setdefault(name, {}).update([kv.split("=", 1)])
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="pcm-bench-") as tmp:
        for r in range(args.repeats):
            for name, overrides in variants.items():
                env = {**os.environ, **envs.get(name, {})}
                env["PYTHONPATH"] = str(Path(trees.get(name, Path(__file__).resolve().parent.parent)).resolve())
                cmd = [sys.executable, __file__, "--one", args.recipe, str(args.steps), f"{tmp}/{name}-{r}"]
                out = subprocess.run([*cmd, "--", *args.common, *overrides], env=env, check=True, capture_output=True)
                res = json.loads(out.stdout.decode().strip().splitlines()[-1])
                results[name].append(res)
                print(json.dumps({"variant": name, "repeat": r, **res}), flush=True)
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in results.items()}
    first = next(iter(med))
    ratios = {f"{name}_over_{first}_step": m["step_s"] / med[first]["step_s"] for name, m in med.items()}
    print(json.dumps({"median": med, **ratios}, indent=2))


if __name__ == "__main__":
    main()

"""Fingerprints of what a refactor must not change: run before and after, compare the lines.

    python tools/behaviour_hash.py scheduler            # seconds: four policies x bind x budget x multiple
    python tools/behaviour_hash.py train --steps 6      # minutes: grpo, pilot_commit, adaptive on tiny
    python tools/behaviour_hash.py default              # the default job (pc-megatron train), ~10 min
    python tools/behaviour_hash.py convert              # HF -> Megatron TP2 x PP2 -> HF round trip

Each line is ``name sha256``. ``scheduler`` hashes every batch (prompts, samples, pilot sizes,
rounds) and its stats, for each setting, on an oracle with fixed per-prompt pass rates, and (the
``.../state_dict`` line) the scheduler's checkpoint dict after the last step. ``train``
and ``default`` hash each metrics row without wall-clock figures (``time_*``, every ``*_s`` and
``*_gbps``: seconds and rates), so two runs of the same code on the same machine give the same line. ``convert`` hashes
every tensor of the round-tripped folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CLOCK_PREFIX = ("time_", "wall")
_CLOCK_SUFFIX = ("_s", "_gbps")  # seconds (the project's unit suffix) and rates per second


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()[:16]


class _Oracle:
    """The scheduler's ``generate``: each sample right with its prompt's fixed pass rate."""

    def __init__(self, rates: list[float]) -> None:
        self.rates, self.rng, self.step = rates, random.Random(7), 0

    def __call__(self, requests):
        from pc_megatron.scheduler import Sample

        def draw(prompt: int) -> Sample:
            right = self.rng.random() < self.rates[prompt]
            return Sample(right, float(right), self.step, None, 5 + prompt % 7)

        return [[draw(q.prompt) for _ in range(q.n)] for q in requests]


def scheduler_hashes(steps: int = 40) -> dict[str, str]:
    from pc_megatron.scheduler import Scheduler, SchedulerConfig

    out = {}
    rates = [random.Random(f"rate/{p}").choice([0.0, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]) for p in range(600)]
    settings = []
    for policy in ("grpo", "dapo", "pilot_commit", "adaptive"):
        for bind in (True, False):
            for budget in (1.0, 0.0):
                for multiple in (1, 4):
                    if policy != "adaptive" and budget == 0.0:
                        continue
                    settings.append((policy, bind, budget, multiple))
    for policy, bind, budget, multiple in settings:
        cfg = SchedulerConfig(policy=policy, bind=bind, adaptive_budget=budget, request_multiple=multiple)
        sched = Scheduler(cfg, len(rates), 8, 16, seed=3)
        oracle = _Oracle(rates)
        trail = []
        for step in range(1, steps + 1):
            oracle.step = step
            batch = sched.next_batch(step, oracle, policy_version=step)
            groups = [
                (g.prompt, [(s.correct, s.policy_version, s.tokens) for s in g.samples], g.pilot_samples)
                for g in batch.groups
            ]
            trail.append((groups, batch.rounds, batch.stats))
        name = f"scheduler/{policy}/bind={bind}/budget={budget}/multiple={multiple}"
        out[name] = _digest(trail)
        out[f"{name}/state_dict"] = _digest(sched.state_dict())  # what a checkpoint carries on
    return out


IGNORED: list[str] = []  # key prefixes left out as well (--ignore): metrics a change adds


def _metrics_hash(run_dir: Path) -> str:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skip = (*_CLOCK_PREFIX, *IGNORED)
    kept = [{k: v for k, v in r.items() if not k.startswith(skip) and not k.endswith(_CLOCK_SUFFIX)} for r in rows]
    return _digest(kept)


def _train(run_dir: Path, overrides: list[str]) -> str:
    cmd = [
        sys.executable,
        "-m",
        "pc_megatron.cli",
        "train",
        "tiny",
        f"out_dir={run_dir.parent}",
        f"name={run_dir.name}",
        "progress=false",
        *overrides,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return _metrics_hash(run_dir)


def train_hashes(steps: int, extra: list[str]) -> dict[str, str]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in ("grpo", "pilot_commit", "adaptive"):
            over = [
                f"steps={steps}",
                "eval.every_steps=3",
                "eval.num_prompts=64",
                "checkpoint.every_steps=0",
                f"scheduler.policy={policy}",
                "algo.prompts_per_step=16",
                *extra,
            ]
            out[f"train/{policy}/steps={steps}"] = _train(Path(tmp) / policy, over)
    return out


def default_hash(extra: list[str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        return {"default": _train(Path(tmp) / "default", extra)}


def convert_hash() -> dict[str, str]:
    from safetensors.torch import load_file

    from pc_megatron.config import load_config
    from pc_megatron.run.prepare import prepare_run

    policy_dir = prepare_run(load_config("tiny", ["progress=false"]), progress=False).policy_dir
    with tempfile.TemporaryDirectory() as tmp:
        mg, hf = Path(tmp) / "mg", Path(tmp) / "hf"
        for argv in (
            ["--to", "megatron", str(policy_dir), str(mg), "--tp", "2", "--pp", "2"],
            ["--to", "hf", str(mg), str(hf)],
        ):
            subprocess.run(
                [sys.executable, "-m", "pc_megatron.cli", "convert", *argv],
                check=True,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
            )
        tensors = {}
        for f in sorted(hf.glob("*.safetensors")):
            tensors |= load_file(f)
        h = hashlib.sha256()
        for name in sorted(tensors):
            h.update(name.encode())
            h.update(tensors[name].float().numpy().tobytes())
        return {"convert/tp2pp2": h.hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="+", choices=["scheduler", "train", "default", "convert"])
    ap.add_argument("--steps", type=int, default=6, help="RL steps of each `train` run")
    ap.add_argument("--ignore", nargs="+", default=[], metavar="PREFIX", help="metric keys left out (new ones)")
    ap.add_argument("--overrides", nargs="+", default=[], metavar="KEY=VALUE", help="added to `train`/`default`")
    args = ap.parse_args()
    IGNORED.extend(args.ignore)
    for what in args.what:
        res = {
            "scheduler": scheduler_hashes,
            "train": lambda: train_hashes(args.steps, args.overrides),
            "default": lambda: default_hash(args.overrides),
            "convert": convert_hash,
        }[what]()
        for name, digest in res.items():
            print(name, digest, flush=True)


if __name__ == "__main__":
    main()

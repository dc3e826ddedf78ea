"""Pass-rate profile of an RL prompt pool under the initial policy (the warm-start).

    python tools/pool_stats.py [RECIPE] [key=value ...] [--prompts 1000] [--n 8]

Samples ``n`` rollouts at the recipe's rollout temperature for the first ``--prompts`` train
prompts and prints, per family and overall, the mean pass rate and the fractions of groups that
are all-correct / all-wrong (degenerate: zero GRPO advantage). This is how the ``hard`` and
``easy`` pools are characterised (docs/LOG.md).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from pc_megatron.config import load_config
from pc_megatron.model.tokenizer import load_tokenizer
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.rollout.engines import build_engine
from pc_megatron.rollout.generate import encode_prompts, generate_and_score
from pc_megatron.run.prepare import load_task, rl_pool, warm_started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("recipe", nargs="?", default="tiny")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--dump", help="also write one JSON line per prompt (prompt, family, pass rate)")
    args = ap.parse_args()
    cfg = load_config(args.recipe, args.overrides)
    torch.set_num_threads(cfg.threads)
    task = load_task(cfg)
    policy = warm_started(cfg, task.sft, progress=cfg.progress)
    task = rl_pool(cfg, task, policy, progress=cfg.progress)
    tok = load_tokenizer(policy)
    engine = build_engine(cfg.rollout, policy)
    rows = task.train[: args.prompts]
    params = cfg.rollout.sampling()
    with RewardPool(cfg.reward) as rewards:
        comps, scored = generate_and_score(
            engine, tok, rewards, rows, encode_prompts(tok, rows), args.n, params, cfg.seed
        )
    results = scored.results
    passes: dict[int, int] = defaultdict(int)
    for c, res in zip(comps, results, strict=True):
        passes[c.prompt_index] += int(res.correct)
    if args.dump:
        with open(args.dump, "w") as f:
            for i, r in enumerate(rows):
                row = {"prompt": r.prompt, "family": r.meta.get("family"), "pass": passes[i] / args.n}
                f.write(json.dumps(row) + "\n")
    by_family: dict[str, list[float]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_family[str(r.meta.get("family", "all"))].append(passes[i] / args.n)
    by_family["ALL"] = [p for v in by_family.values() for p in v]
    print(f"pool={cfg.data.synthetic.pool} prompts={len(rows)} n={args.n} T={cfg.rollout.temperature}")
    print("| family | share | mean pass rate | all correct | all wrong | degenerate |")
    print("|---|---|---|---|---|---|")
    for fam, rates in sorted(by_family.items(), key=lambda kv: (kv[0] == "ALL", kv[0])):
        ac = sum(p == 1.0 for p in rates) / len(rates)
        aw = sum(p == 0.0 for p in rates) / len(rates)
        share = len(rates) / len(rows)
        print(f"| {fam} | {share:.2f} | {sum(rates) / len(rates):.3f} | {ac:.2f} | {aw:.2f} | {ac + aw:.2f} |")


if __name__ == "__main__":
    main()

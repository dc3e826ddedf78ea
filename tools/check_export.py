"""Does a trained run's HF export answer like the run's engine did?

Converts the run's latest checkpoint with ``pc-megatron convert --to hf``, loads the folder in
transformers (the ``hf`` engine: ``AutoModelForCausalLM`` and its ``generate``), answers the run's
held-out set with the run's evaluation settings, and prints that accuracy beside the run's last
evaluation (the engine the run used, with the same final weights). Greedy evaluation should agree to
within a prompt or two (fp32 sums in another order can flip a near tie).

    python tools/check_export.py RUN_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("out", type=Path, help="the HF folder to write (must not exist)")
    args = ap.parse_args()

    from pc_megatron.cli import main as cli
    from pc_megatron.config import load_config
    from pc_megatron.evaluate import evaluate
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.hf_engine import HFEngine
    from pc_megatron.run.logs import read_metrics
    from pc_megatron.run.prepare import prepare_run

    t0 = time.monotonic()
    if cli(["convert", "--to", "hf", str(args.run), str(args.out)]) != 0:
        return 1
    convert_s = time.monotonic() - t0
    cfg = load_config(str(args.run / "config.yaml"))
    last = [r for r in read_metrics(args.run) if "eval_accuracy" in r][-1]
    prepared = prepare_run(cfg, progress=False)
    engine = HFEngine(args.out)
    params = cfg.rollout.sampling()
    t0 = time.monotonic()
    with RewardPool(cfg.reward) as rewards:
        got = evaluate(engine, prepared.tokenizer, prepared.task.eval, cfg.eval, rewards, params, seed=0)
    out = {
        "step": last["step"],
        "prompts": len(prepared.task.eval),
        "run_eval_accuracy": last["eval_accuracy"],
        "export_eval_accuracy": got["eval_accuracy"],
        "run_boxed_frac": last.get("eval_boxed_frac"),
        "export_boxed_frac": got.get("eval_boxed_frac"),
        "prompts_apart": round(abs(got["eval_accuracy"] - last["eval_accuracy"]) * len(prepared.task.eval), 2),
        "convert_s": round(convert_s, 1),
        "eval_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Issue 25's real-model level: GRPO, Pilot-Commit and adaptive on smollm2-arith's pool (SmolLM2-135M
# after its cached warm-start, word problems, math-verify), paired by seed at equal rollouts.
#
#   bash tools/real_pool_bench.sh OUT [SEED ...]     # default seeds: 0 1 2 3 4
#
# One run at a time (a smollm2 run takes ~12 GiB of a 24 GiB machine). Every method gets the same
# recipe and a budget of ~512 rollouts (GRPO 8 steps at 64 per step): GRPO's held-out accuracy
# rises from 0.18 to 0.40 within its first 320 rollouts and is level after (docs/LOG.md), so the
# budget covers the rise and the eval points are dense there. Only the steps and the eval spacing
# differ between methods, each curve getting five points inside or at the budget:
#   grpo           8 steps, eval every 2  (0, 128, 256, 384, 512 rollouts)
#   pilot_commit   4 steps, eval every 1  (~170 rollouts a step: pilots of 2 + commits of 6)
#   adaptive       9 steps, eval every 2  (at most 64 rollouts a step: its budget), and at its last
# Evaluation is greedy on the first 300 of the 600 held-out problems (the set is shuffled; every
# run scores the same 300). `pc-megatron compare` runs them (a finished run is reused and a cut one
# resumed, so the script can be run again after an interruption) and writes the paired figures to
# OUT/compare.{json,md,png}.
set -euo pipefail
OUT=${1:?usage: tools/real_pool_bench.sh OUT [SEED ...]}
shift
SEEDS=${*:-0 1 2 3 4}
# shellcheck disable=SC2086
pc-megatron compare smollm2-arith eval.num_prompts=300 checkpoint.every_steps=2 checkpoint.keep_last=1 \
    --methods grpo pilot_commit adaptive --seeds $SEEDS --out "$OUT" \
    --method-overrides grpo steps=8 eval.every_steps=2 \
    --method-overrides pilot_commit steps=4 eval.every_steps=1 \
    --method-overrides adaptive steps=9 eval.every_steps=2

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
#   adaptive       7 steps, eval every 2  (~80 rollouts a step), and at its last
# Evaluation is greedy on the first 300 of the 600 held-out problems (the set is shuffled; every
# run scores the same 300). A finished run is reused and a cut one resumed, so the script can be run
# again after an interruption; at the end `pc-megatron compare` (which reuses them all) writes the
# paired figures to OUT/compare.{json,md,png}.
set -euo pipefail
OUT=${1:?usage: tools/real_pool_bench.sh OUT [SEED ...]}
shift
SEEDS=${*:-0 1 2 3 4}
COMMON="eval.num_prompts=300 checkpoint.every_steps=2 checkpoint.keep_last=1 progress=false"
for s in $SEEDS; do
    for spec in "grpo 8 2" "pilot_commit 4 1" "adaptive 7 2"; do
        read -r method steps every <<<"$spec"
        dir="$OUT/seed$s/$method"
        if [ -f "$dir/summary.json" ]; then
            echo "reused $method seed $s"
            continue
        fi
        if [ -d "$dir" ] && [ ! -f "$dir/checkpoints/latest" ]; then  # died before its first checkpoint
            mv "$dir" "$dir.failed-$(date +%s)"
        fi
        mkdir -p "$OUT/seed$s"
        echo "$(date +%T) start $method seed $s"
        if [ -f "$dir/checkpoints/latest" ]; then
            pc-megatron train --resume "$dir" >>"$OUT/seed$s/$method.log" 2>&1
        else
            # shellcheck disable=SC2086
            pc-megatron train smollm2-arith seed="$s" scheduler.policy="$method" steps="$steps" \
                eval.every_steps="$every" $COMMON out_dir="$OUT/seed$s" name="$method" \
                >>"$OUT/seed$s/$method.log" 2>&1
        fi
        echo "$(date +%T) done $method seed $s"
    done
done
# shellcheck disable=SC2086
pc-megatron compare smollm2-arith --methods grpo pilot_commit adaptive --seeds $SEEDS --out "$OUT"

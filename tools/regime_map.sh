#!/usr/bin/env bash
# The regime map (docs/LOG.md, 2026-12-04): GRPO, faithful Pilot-Commit (n = 32 as 8 + 24) and the
# adaptive allocator on prompt pools from few to most degenerate groups, three seeds each, with
# one recipe for every method and level (nothing tuned per method or per pool).
#
#   bash tools/regime_map.sh OUT [LEVEL ...]   # graded70 easy hard graded40 dapo ablate small grid n64 n128 confound
#                                              # grpo-lr default
#   SEEDS="0 1 2 3 4" MAP_STEPS=200 MAP_LR=3e-5 bash tools/regime_map.sh OUT n64 n128   # the #25 benchmark's knobs
#
# SEEDS, MAP_STEPS and MAP_LR change the recipe of every level alike (give such a run its own OUT:
# a finished run in OUT is reused whatever its recipe was).
# Each level is one `pc-megatron compare` (two runs at a time); a finished run is reused and a cut
# one resumed, so the script can be run again after an interruption.
set -euo pipefail
OUT=${1:?usage: tools/regime_map.sh OUT [LEVEL ...]}
shift
LEVELS=${*:-graded70 easy hard graded40 dapo ablate small n64 default}
SEEDS=${SEEDS:-0 1 2}
STEPS=${MAP_STEPS:-80}
LR=${MAP_LR:-3e-5}
# n = 32, B = 16 (512 rollouts per GRPO step); lr 3e-5: at the tiny recipe's 1e-4, GRPO lowered the
# held-out accuracy on the graded pool within 20 steps (so did B = 32, and no std normalisation)
MAP="algo.samples_per_prompt=32 algo.prompts_per_step=16 steps=$STEPS learner.lr=$LR
     learner.min_lr=$(python -c "print($LR / 3)") learner.lr_warmup_steps=10 learner.lr_decay_steps=$STEPS
     eval.every_steps=$((STEPS / 8)) checkpoint.every_steps=20"
GRADED70="data.synthetic.pool=graded data.synthetic.hopeless_frac=0.45 data.synthetic.solved_frac=0.25"
GRADED40="data.synthetic.pool=graded data.synthetic.hopeless_frac=0.25 data.synthetic.solved_frac=0.15"
for level in $LEVELS; do
    case $level in
        graded70) pool=$GRADED70 methods="grpo pilot_commit adaptive" ;;
        easy) pool="data.synthetic.pool=easy" methods="grpo pilot_commit adaptive" ;;
        hard) pool="data.synthetic.pool=hard" methods="grpo pilot_commit" ;;
        graded40) pool=$GRADED40 methods="grpo pilot_commit" ;;
        dapo)  # DAPO at two levels, beside the runs of those levels (reused; compare.json then has all)
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 --methods grpo pilot_commit adaptive dapo --seeds $SEEDS \
                --jobs 2 --out "$OUT/graded70"
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP data.synthetic.pool=hard --methods grpo pilot_commit dapo --seeds $SEEDS \
                --jobs 2 --out "$OUT/hard"
            continue ;;
        ablate)  # adaptive without its cheap pilots (8-sample pilots, as faithful Pilot-Commit's), GRPO reused
            mkdir -p "$OUT/graded70-pilot8"
            for s in $SEEDS; do
                mkdir -p "$OUT/graded70-pilot8/seed$s"
                ln -sfn "$(realpath "$OUT/graded70/seed$s/grpo")" "$OUT/graded70-pilot8/seed$s/grpo"
            done
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 scheduler.adaptive_pilot=8 --methods grpo adaptive \
                --seeds $SEEDS --jobs 2 --out "$OUT/graded70-pilot8"
            continue ;;
        small)  # the graded70 mix on a pool of 1,000 prompts: several epochs in 80 steps, where what the
            # run learned about a prompt in one epoch can steer the next (4,000 prompts: 0.3 to 1.3 epochs)
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 data.synthetic.pool_size=1000 \
                --methods grpo pilot_commit adaptive --seeds $SEEDS --jobs 2 --out "$OUT/graded70-small"
            continue ;;
        grid)  # adaptive after its pass-rate grid fix (commit 0086247) beside the same GRPO and
            # Pilot-Commit runs (reused through links), on the 4,000- and the 1,000-prompt pool
            for lv in graded70 graded70-small; do
                for s in $SEEDS; do
                    mkdir -p "$OUT/$lv-grid/seed$s"
                    for m in grpo pilot_commit; do ln -sfn "$(realpath "$OUT/$lv/seed$s/$m")" "$OUT/$lv-grid/seed$s/$m"; done
                done
                size=""
                [ $lv = graded70-small ] && size="data.synthetic.pool_size=1000"
                # shellcheck disable=SC2086
                pc-megatron compare tiny $MAP $GRADED70 $size --methods grpo pilot_commit adaptive --seeds $SEEDS \
                    --jobs 2 --out "$OUT/$lv-grid"
            done
            continue ;;
        n64)  # n = 64 as 16 + 48, B = 8 (the same 512 rollouts per GRPO step)
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 algo.samples_per_prompt=64 algo.prompts_per_step=8 \
                --methods grpo pilot_commit adaptive --seeds $SEEDS --jobs 2 --out "$OUT/graded70-n64"
            continue ;;
        n128)  # n = 128 as 32 + 96 (the paper's 1.5B split), B = 4: the same 512 rollouts per GRPO step
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 algo.samples_per_prompt=128 algo.prompts_per_step=4 \
                --methods grpo pilot_commit adaptive --seeds $SEEDS --jobs 2 --out "$OUT/graded70-n128"
            continue ;;
        grpo-lr)  # #25: GRPO alone at the n64 shape at three learning rates, to find one at which it keeps
            # improving over the run (the benchmark then uses that one for every method)
            for lr in 3e-5 6e-5 1e-4; do
                # shellcheck disable=SC2086
                pc-megatron compare tiny $MAP $GRADED70 algo.samples_per_prompt=64 algo.prompts_per_step=8 \
                    learner.lr=$lr "learner.min_lr=$(python -c "print($lr / 3)")" --methods grpo --seeds $SEEDS \
                    --jobs 2 --out "$OUT/grpo-lr$lr"
            done
            continue ;;
        confound)  # #25: the public recipe sizes the PPO mini-batch from n_c (32 prompts x n_c rollouts), so a
            # Pilot-Commit step takes more optimizer steps than GRPO's. At the n64 level with 2-prompt
            # mini-batches: GRPO 512 / 128 = 4 steps; Pilot-Commit at equal steps (2 prompts) 4, at the
            # recipe's sizing (2 x 48 = 96 rollouts) ceil(512 / 96) = 6. GRPO is reused by both.
            N64="algo.samples_per_prompt=64 algo.prompts_per_step=8"
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 $N64 algo.mini_batch_size=2 --methods grpo pilot_commit \
                --seeds $SEEDS --jobs 2 --out "$OUT/confound-equal"
            for s in $SEEDS; do
                mkdir -p "$OUT/confound-recipe/seed$s"
                ln -sfn "$(realpath "$OUT/confound-equal/seed$s/grpo")" "$OUT/confound-recipe/seed$s/grpo"
            done
            # shellcheck disable=SC2086
            pc-megatron compare tiny $MAP $GRADED70 $N64 algo.mini_batch_rollouts=96 --methods grpo pilot_commit \
                --seeds $SEEDS --jobs 2 --out "$OUT/confound-recipe"
            continue ;;
        default)  # the default recipe (n = 8, B = 64, lr 1e-4): Pilot-Commit with the recipe's defaults
            # shellcheck disable=SC2086
            pc-megatron compare tiny --methods grpo pilot_commit --seeds 0 --jobs 2 --out "$OUT/default"
            continue ;;
        *) echo "unknown level $level" >&2; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    pc-megatron compare tiny $MAP $pool --methods $methods --seeds $SEEDS --jobs 2 --out "$OUT/$level"
done

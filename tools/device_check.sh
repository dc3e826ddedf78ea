#!/usr/bin/env bash
# Every GPU path this machine's image can run, in one call, within a deadline:
#
#   bash tools/device_check.sh [BUDGET_S]        # default 540 s; writes logs and results under $OUT
#   ONLY="kernel-tests bench-learner" bash tools/device_check.sh 300     # a subset of the parts
#
# 1. the Triton kernel tests, compiled on the GPU (tests/test_grpo_loss_kernel.py)
# 2. the gpu-marked tests (tests/test_gpu.py; TE / vLLM / two-GPU ones skip if absent)
# 3. the RL loop on the GPU: `pc-megatron train tiny` (Megatron-Core learner over NCCL, the
#    Triton log-prob kernel, the hf engine on CUDA, in-memory weight sync every step)
# 4. tools/bench_learner.py: a 1.5B-shaped learner, bf16 (FP8 where TE is installed)
# 5. tools/bench_grpo_loss.py: the loss paths at T = 8k / 32k, V = 152064
# 6. tools/bench_weight_sync.py: CUDA IPC / shm / bytes transports into a receiver process
# 7. the CPU test files whose code picks CUDA when it is there (learner, rollout, loop parts)
#
# The device image brings torch, triton and transformers; megatron-core, omegaconf and antlr4 come
# as wheels in .whl/ (see docs/LOG.md for the download line). Each part gets min(cap, time left),
# so one hang cannot eat the rest; the summary table is printed last.
set -u
BUDGET_S=${1:-540}
OUT=${OUT:-/tmp/pcm-device-out}
mkdir -p "$OUT"
T0=$(date +%s)
LOG="$OUT/device_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export PC_MEGATRON_CACHE=/tmp/pcm-cache
SUMMARY=()

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >>"$LOG" 2>&1 || echo "wheel install failed (see log)"
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi

part() {  # part NAME CAP_S COMMAND...
    local name=$1 cap=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    local left=$((BUDGET_S - ($(date +%s) - T0)))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -le 5 ]; then
        SUMMARY+=("| $name | not run (budget spent) | |")
        return
    fi
    echo "===== $name (limit ${limit}s): $*" | tee -a "$LOG"
    local t=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$? dt=$(($(date +%s) - t))
    local verdict="ok"
    [ $rc -ne 0 ] && verdict="rc=$rc"
    [ $rc -eq 124 ] && verdict="timed out"
    SUMMARY+=("| $name | $verdict | ${dt}s |")
    echo "----- $name: $verdict in ${dt}s" | tee -a "$LOG"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
    python3 -c "import megatron.core, omegaconf; print('megatron-core', megatron.core.__version__, 'omegaconf', omegaconf.__version__)"
    python3 -c "import importlib.util as u; print({m: u.find_spec(m) is not None for m in ('transformer_engine', 'vllm', 'ray', 'apex')})"
} 2>&1 | tee -a "$LOG"

part kernel-tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_grpo_loss_kernel.py -rs
part gpu-tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -rs
part train-loop 150 python3 -m pc_megatron.cli train tiny steps=12 eval.every_steps=6 checkpoint.every_steps=6 \
    progress=false name=gpu-tiny out_dir=/tmp/pcm-runs
cp /tmp/pcm-runs/gpu-tiny/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null
part resume 90 python3 -m pc_megatron.cli train --resume /tmp/pcm-runs/gpu-tiny steps=14 progress=false
part bench-learner 150 python3 tools/bench_learner.py --seq 1024 --batch 8 --steps 5 --out "$OUT/learner.json"
part bench-grpo-loss 120 python3 tools/bench_grpo_loss.py --tokens 8192 32768 \
    --modes ${GRPO_MODES:-eager kernel eager_linear fused_linear compile} --repeats 5 --csv "$OUT/grpo_loss.csv"
part bench-sync 90 python3 tools/bench_weight_sync.py --skip-sync --skip-rollout --transports cuda_ipc shm bytes \
    --receivers 1 --repeats 3 --workdir /tmp/pcm-bench-sync --out "$OUT/sync.json"
part cpu-tests-on-cuda 150 python3 -m pytest -q -p no:cacheprovider tests/test_mapping_learner.py \
    tests/test_rollout.py tests/test_loop_parts.py tests/test_advantages_loss.py

{
    echo
    grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9=]|^FAILED|^ERROR" | tail -20
    grep -E "^\| |fp8|skipped \(|broadcast:|projected|^\{\"model" "$LOG" | tail -40
    echo
    echo "| part | result | time |"
    echo "|---|---|---|"
    printf '%s\n' "${SUMMARY[@]}"
    echo "total $(($(date +%s) - T0))s"
} | tee -a "$LOG"

#!/usr/bin/env bash
# Every GPU check the lent H200's image can run, in one call, within a deadline, and one JSON of what
# finished (written after every part, so a call cut short still leaves it):
#
#   bash tools/device_check.sh [BUDGET_S]        # default 520 s; logs and results under $OUT
#   ONLY="gpu-tests learner-ragged" bash tools/device_check.sh 300     # a subset of the parts
#
# The image (docs/LOG.md): Python 3.12, torch 2.11 (cu130), Triton 3.6, transformers 5.17, numpy,
# pytest; no vLLM, Transformer Engine or Ray, no registry. From a clean checkout, `bash
# tools/device_wheels.sh` builds what it lacks into .whl/ (megatron-core, omegaconf, antlr4, psutil,
# hypothesis; carry=[".whl"]). One GPU: no NCCL between GPUs. So the parts are:
#
#  gpu-tests         every test marked gpu in the tree (packed vs padded ragged micro-batches, the pinned
#                    offload, CUDA IPC into another process (also under expandable segments), the
#                    asynchronous loop on CUDA, the compiled Triton kernels, ...); the TE / vLLM / Ray /
#                    two-GPU ones skip, each saying why; a table of each test's result in gpu_tests.md,
#                    each test within 90 s (a stuck one is timed out and the rest still run)
#  kernel-tests      the Triton kernels' other tests, compiled (tests/kernels/test_grpo_loss.py)
#  learner-ragged    tools/bench_learner.py --ragged at the Qwen2.5-1.5B shape, bf16: padded rows
#                    against token-budget micro-batches (padded and packed), tokens/s and peak memory
#  async-loop        pc-megatron train tiny at rollout.max_staleness=1 on the GPU (learner and hf engine in
#                    one process): its metrics show the busy and idle shares on a real device
#  distopt-resume    pc-megatron train tiny with the distributed optimizer to step 4, then --resume to
#                    step 6 (torch's Adam under Megatron: compat/torch_adam.py)
#  bench-sync        tools/bench_weight_sync.py: CUDA IPC / shm / bytes into a receiver process,
#                    synchronised copy-out, every bucket checksummed on the first sync
#  learner-dense     tools/bench_learner.py at the 1.5B shape: train and log-prob tokens/s, export
#                    GB/s, the pinned offload's round trip
#  cpu-tests-on-cuda the one-process learner tests with CUDA present (shape, mapping, rollout, loop)
#
# Each part gets min(its cap, the time left); the JSON ($OUT/device_check.json) holds each part's
# result and seconds and the figures its tools wrote.
set -u
BUDGET_S=${1:-520}
OUT=${OUT:-/tmp/pcm-device-out}
mkdir -p "$OUT"
T0=$(date +%s)
LOG="$OUT/device_check.log"
PARTS="$OUT/parts.jsonl"
: >"$LOG"
: >"$PARTS"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export PC_MEGATRON_CACHE=/tmp/pcm-cache

[ -d .whl ] || echo "no .whl/: run bash tools/device_wheels.sh here first and carry it (carry=[\".whl\"])" | tee -a "$LOG"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        >>"$LOG" 2>&1 || echo "wheel install failed (see log)"
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi

summarise() {  # device_check.json from parts.jsonl and the figure files present
    python3 - "$OUT" <<'PY' >>"$LOG" 2>&1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
parts = [json.loads(line) for line in (out / "parts.jsonl").read_text().splitlines() if line.strip()]
figures = {}
for name in ("env", "learner_ragged", "learner_dense", "sync", "distopt_resume", "async_loop"):
    f = out / f"{name}.json"
    if f.is_file():
        try:
            figures[name] = json.loads(f.read_text())
        except ValueError as e:
            figures[name] = f"unreadable: {e}"
(out / "device_check.json").write_text(json.dumps({"parts": parts, "figures": figures}, indent=2))
PY
}

part() {  # part NAME CAP_S COMMAND...
    local name=$1 cap=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    local left=$((BUDGET_S - ($(date +%s) - T0)))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -le 5 ]; then
        echo "{\"part\": \"$name\", \"result\": \"not run (budget spent)\", \"seconds\": 0}" >>"$PARTS"
        summarise
        return
    fi
    echo "===== $name (limit ${limit}s): $*" | tee -a "$LOG"
    local t=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$? dt=$(($(date +%s) - t))
    local verdict="ok"
    [ $rc -ne 0 ] && verdict="rc=$rc"
    [ $rc -eq 124 ] && verdict="timed out"
    echo "{\"part\": \"$name\", \"result\": \"$verdict\", \"seconds\": $dt}" >>"$PARTS"
    summarise
    echo "----- $name: $verdict in ${dt}s" | tee -a "$LOG"
}

python3 - "$OUT/env.json" <<'PY' 2>&1 | tee -a "$LOG"
import importlib.util as u, json, sys, subprocess
import torch, triton, transformers
env = {
    "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
    "triton": triton.__version__, "transformers": transformers.__version__,
    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    "gpus": torch.cuda.device_count(),
    "present": {m: u.find_spec(m) is not None for m in ("megatron.core", "transformer_engine", "vllm", "ray")},
    # what `pc-megatron train` and the tests import: a missing one is named here, not by a traceback later
    "missing": [m for m in ("omegaconf", "antlr4", "psutil", "hypothesis", "tensorboard", "pyarrow", "matplotlib",
                            "safetensors", "tqdm", "yaml") if u.find_spec(m) is None],
}
json.dump(env, open(sys.argv[1], "w"), indent=2)
print(json.dumps(env))
PY

# every test marked gpu in the tree, the kernels' included; a file whose imports the image lacks is
# reported (not collected) instead of stopping the rest; each test has its own deadline, and a stuck one is
# recorded as timed out while the rest run on (tools/resumable_pytest.py); gpu_tests.md says what ran,
# what skipped and why, written after every test
part gpu-tests 240 python3 tools/resumable_pytest.py --timeout 90 --budget 235 --table "$OUT/gpu_tests.md" -- \
    -q -m gpu tests --continue-on-collection-errors -rs
[ -f "$OUT/gpu_tests.md" ] && tee -a "$LOG" <"$OUT/gpu_tests.md"
part async-loop 120 bash -c 'rm -rf /tmp/pcm-runs-async && \
    python3 -m pc_megatron.cli train tiny steps=6 rollout.max_staleness=1 eval.every_steps=6 progress=false \
        name=async out_dir=/tmp/pcm-runs-async && \
    python3 -c "import json; rows=[json.loads(l) for l in open(\"/tmp/pcm-runs-async/async/metrics.jsonl\")][2:]; \
json.dump({k: [r.get(k) for r in rows] for k in (\"time_step_s\", \"time/learner_busy_s\", \"time/engine_busy_s\", \
\"rollout/staleness_max\", \"correction/ess\", \"logprob_mismatch_max\")}, open(\"'"$OUT"'/async_loop.json\", \"w\"))"'
part kernel-tests 90 python3 -m pytest -q -p no:cacheprovider -m "not gpu" tests/kernels/test_grpo_loss.py -rs
part learner-ragged 150 python3 tools/bench_learner.py --ragged --shape qwen1.5b --rows 64 --mu 6.3 --sigma 0.8 \
    --min-len 64 --max-len 8192 --budget 16384 --rounds 1 --steps 2 --workdir /tmp/pcm-ragged --out "$OUT/learner_ragged.json"
part distopt-resume 90 bash -c 'rm -rf /tmp/pcm-runs/distopt && \
    python3 -m pc_megatron.cli train tiny steps=4 learner.distributed_optimizer=true checkpoint.every_steps=2 \
        eval.every_steps=4 progress=false name=distopt out_dir=/tmp/pcm-runs && \
    python3 -m pc_megatron.cli train --resume /tmp/pcm-runs/distopt steps=6 progress=false && \
    python3 -c "import json; rows=[json.loads(l) for l in open(\"/tmp/pcm-runs/distopt/metrics.jsonl\")]; \
json.dump({\"steps\": [r[\"step\"] for r in rows], \"loss\": [r.get(\"loss\") for r in rows], \
\"mismatch_max\": max(r.get(\"logprob_mismatch_max\", 0) for r in rows)}, open(\"'"$OUT"'/distopt_resume.json\", \"w\"))"'
part bench-sync 75 python3 tools/bench_weight_sync.py --skip-sync --skip-rollout --transports cuda_ipc shm bytes \
    --receivers 1 --repeats 3 --workdir /tmp/pcm-bench-sync --out "$OUT/sync.json"
part learner-dense 90 python3 tools/bench_learner.py --seq 1024 --batch 8 --steps 3 --out "$OUT/learner_dense.json"
part cpu-tests-on-cuda 120 python3 -m pytest -q -p no:cacheprovider -m "not gpu and not slow" \
    tests/learner/test_learner.py tests/learner/test_export.py tests/learner/test_checkpoint_io.py \
    tests/weight_sync/test_mapping.py tests/rollout/test_hf_engine.py tests/test_batch.py tests/test_evaluate.py \
    tests/test_phases.py tests/run/test_logs.py tests/algo tests/learner/test_microbatch.py \
    tests/learner/test_layout.py

summarise
{
    echo
    grep -E "passed|failed|error" "$LOG" | grep -E "^[0-9=]|^FAILED|^ERROR" | tail -20
    grep -E "^\| |skipped \(|projected" "$LOG" | tail -40
    echo
    cat "$PARTS"
    echo "total $(($(date +%s) - T0))s; figures in $OUT/device_check.json"
} | tee -a "$LOG"

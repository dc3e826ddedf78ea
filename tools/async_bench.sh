#!/usr/bin/env bash
# The asynchronous-loop experiments of docs/LOG.md (issue "Asynchronous RL with Pilot-Commit"), each a
# tools/async_bench.py call into OUT/<name>; resumable (finished runs are reused). Run the timed ones
# (tiny, smollm2) alone on the machine: their wall times are compared.
#
#   bash tools/async_bench.sh OUT tiny smollm2 policies control
#
#   tiny      η = 1 against η = 0, tiny on split Ray placement with vLLM engines, 3 seeds (timed)
#   smollm2   the same for smollm2-arith, one seed (timed)
#   policies  Pilot-Commit and adaptive at η = 1 against η = 0, tiny, 3 seeds (accuracy, staleness)
#   control   η = 4 with the correction off against on (tiny, 3 seeds): what the correction changes
#   stream    Pilot-Commit's unbound rounds with the pilot→commit barrier against streamed (vLLM, timed)
set -euo pipefail
OUT=${1:?usage: async_bench.sh OUT LEVEL...}
shift
SPLIT="runtime=ray ray.placement=split rollout.backend=vllm"  # threads: auto (the placement's share)
for level in "$@"; do
  case "$level" in
    tiny) python tools/async_bench.py --out "$OUT/tiny" --seeds 0 1 2 --etas 0 1 -- tiny $SPLIT ;;
    smollm2) python tools/async_bench.py --out "$OUT/smollm2" --seeds 0 --etas 0 1 -- smollm2-arith $SPLIT \
        eval.num_prompts=200 ;;  # the recipe's 600 held-out problems take ~6 min an evaluation on 2 cores
    policies)
      for policy in pilot_commit adaptive; do
        python tools/async_bench.py --out "$OUT/$policy" --seeds 0 1 2 --etas 0 1 -- tiny \
          scheduler.policy=$policy
      done ;;
    control)
      python tools/async_bench.py --out "$OUT/control" --seeds 0 1 2 --variants \
        tis:rollout.max_staleness=4,algo.loss.correction=tis none:rollout.max_staleness=4,algo.loss.correction=none \
        -- tiny ;;
    stream)
      python tools/async_bench.py --out "$OUT/stream" --seeds 0 1 2 --variants barrier:scheduler.stream=false \
        stream:scheduler.stream=true -- tiny scheduler.policy=pilot_commit scheduler.bind=false \
        rollout.backend=vllm rollout.max_new_tokens=24 steps=40 ;;
    *) echo "unknown level $level" >&2; exit 2 ;;
  esac
done

"""Builds a vLLM engine on the model folder given (which starts vLLM's engine-core and worker
processes), prints ``PIDS`` and the pids of this process's descendants, then waits to be killed."""

import sys
import time

import psutil

from pc_megatron.rollout.config import RolloutConfig, VllmConfig
from pc_megatron.rollout.vllm_engine import VllmEngine


def main() -> None:
    cfg = RolloutConfig(backend="vllm", vllm=VllmConfig(max_model_len=64, max_num_seqs=8, cpu_kv_cache_gb=0.125))
    engine = VllmEngine(sys.argv[1], cfg)  # noqa: F841 (held until the kill)
    print("PIDS", *(p.pid for p in psutil.Process().children(recursive=True)), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()

"""Run under torchrun: for each HF model folder, build the learner at the given TP size and save
(rank 0) its logits, its HF export, and the stats and logits after one RL step."""

import os
import sys
from pathlib import Path

import torch

from pc_megatron.algo import LossConfig
from pc_megatron.learner import Learner, LearnerConfig, TokenBatch


def main() -> None:
    out, tp, folders = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(1)
    if os.environ.get("PCM_BAD_GLU_SHARD"):  # negative control: fc1 = [gate; up] cut in plain row blocks
        import pc_megatron.learner.learner as lm
        from pc_megatron.weight_sync import sharding

        real = sharding.megatron_shard_from_hf

        def bad(name, hf, arch, rank, size):
            if not name.endswith("linear_fc1.weight"):
                return real(name, hf, arch, rank, size)
            return real(name, hf, arch, 0, 1).chunk(size, 0)[rank]

        lm.megatron_shard_from_hf = bad
    for folder in folders:
        learner = Learner(folder, LearnerConfig(tensor_parallel_size=tp, micro_batch_size=2), seed=0)
        result = run_checks(learner)
        if int(os.environ.get("RANK", 0)) == 0:
            torch.save(result, out / f"{Path(folder).name}.pt")


def run_checks(learner: Learner) -> dict:
    tokens = torch.randint(0, 96, (3, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = learner._logits(tokens).float()
    hf = {k: v.clone() for k, v in learner.hf_named_tensors()}  # views of the parameters: copy
    batch = TokenBatch(tokens, torch.ones(3, 47))
    old = learner.logprobs(batch)
    stats = learner.train_rl(batch, old, torch.tensor([1.0, -0.5, 0.3]), LossConfig(), 1.0)
    with torch.no_grad():
        after = learner._logits(tokens).float()
    return {"logits": logits, "hf": hf, "stats": stats, "logits_after": after}


if __name__ == "__main__":
    main()

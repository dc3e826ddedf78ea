"""Run under torchrun. For each HF model folder, at the given TP/PP (data parallel takes the
remaining ranks):

- ``check``: logits, HF export, one RL step (batch A) and the logits after it; then save a
  learner checkpoint to OUT/ckpt/NAME and take an SFT step (batch B: its loss depends on the
  weights, its update on the Adam moments) and the logits after it;
- ``resume CKPT_ROOT``: load CKPT_ROOT/NAME and take the same SFT step.

Rank 0 saves the results to OUT/NAME.pt."""

import os
import sys
from pathlib import Path

import torch

from pc_megatron.algo import LossConfig
from pc_megatron.learner import Learner, LearnerConfig, TokenBatch


def batch(seed: int) -> TokenBatch:
    tokens = torch.randint(0, 96, (4, 48), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(4, 47)
    mask[3, 30:] = 0  # uneven token counts across rows: the token mean must still be global
    return TokenBatch(tokens, mask)


ADV = torch.tensor([1.0, -0.5, 0.3, 0.8])


def rl_step(learner: Learner, b: TokenBatch) -> dict:
    return learner.train_rl(b, learner.logprobs(b), ADV, LossConfig(), 1.0)


def main() -> None:
    out, tp, pp, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ckpt_root = Path(sys.argv[5]) if mode == "resume" else out / "ckpt"
    folders = sys.argv[6:] if mode == "resume" else sys.argv[5:]
    torch.set_num_threads(1)
    if os.environ.get("PCM_BAD_GLU_SHARD"):  # negative control: fc1 = [gate; up] cut in plain row blocks
        import pc_megatron.learner.learner as lm

        real = lm.megatron_shard_from_hf

        def bad(name, hf, arch, rank, size):
            if not name.endswith("linear_fc1.weight"):
                return real(name, hf, arch, rank, size)
            return real(name, hf, arch, 0, 1).chunk(size, 0)[rank]

        lm.megatron_shard_from_hf = bad
    cfg = LearnerConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        micro_batch_size=int(os.environ.get("PCM_MICRO_BATCH", 2)),
        distributed_optimizer=bool(os.environ.get("PCM_DIST_OPT")),
    )
    for folder in folders:
        name = Path(folder).name
        learner = Learner(folder, cfg, seed=0)
        tokens = batch(1).tokens
        if mode == "check":
            result = {"logits": learner.forward_logits(tokens)}
            result["hf"] = {k: v.clone() for k, v in learner.hf_named_tensors()}  # views of the parameters
            result["stats"] = rl_step(learner, batch(1))
            result["logits_after"] = learner.forward_logits(tokens)
            learner.save(ckpt_root / name)
        else:
            learner.load(ckpt_root / name)
            result = {"version": learner.version}
        result["stats2"] = learner.train_sft(batch(2))
        result["logits_after2"] = learner.forward_logits(tokens)
        if int(os.environ.get("RANK", 0)) == 0:
            torch.save(result, out / f"{name}.pt")


if __name__ == "__main__":
    main()

"""Run under torchrun. For each HF model folder, at the given TP/PP (data parallel takes the
remaining ranks):

- ``check``: logits, HF export, one RL step (batch A) and the logits after it; then save a
  learner checkpoint to OUT/ckpt/NAME and take an SFT step (batch B: its loss depends on the
  weights, its update on the Adam moments) and the logits after it;
- ``resume CKPT_ROOT``: load CKPT_ROOT/NAME and take the same SFT step;
- ``shape``: on a ragged batch (lengths spanning 50x), for each micro-batch layout of ``SHAPES``,
  log-probs and one RL step's gradients; every rank saves its gradient shards (and the plan's
  micro-batch count of each data-parallel rank) to OUT/NAME-LAYOUT-rankR.pt; then (PP > 1) the HF
  export with the linear weights in bf16 and the norms in fp32, whose dtypes rank 0 saves to
  OUT/NAME-dtypes.pt.

Rank 0 saves the results to OUT/NAME.pt."""

import json
import os
import sys
from pathlib import Path

import torch

from pc_megatron.algo.config import LossConfig
from pc_megatron.batch import TokenBatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner


def batch(seed: int) -> TokenBatch:
    tokens = torch.randint(0, 96, (4, 48), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(4, 47)
    mask[3, 30:] = 0  # uneven token counts across rows: the token mean must still be global
    return TokenBatch(tokens, mask)


ADV = torch.tensor([1.0, -0.5, 0.3, 0.8])

RAGGED_LENGTHS = [4, 200, 9, 57, 120, 16, 33, 81]  # 50x apart, one long tail
# micro-batch layouts compared by the shape tests: fixed rows, token budgets, padded and packed
SHAPES = {
    "rows3": dict(max_tokens_per_micro_batch=0, micro_batch_size=3, packing=False),
    "padded256": dict(max_tokens_per_micro_batch=256, packing=False),
    "packed256": dict(max_tokens_per_micro_batch=256, packing=True),
    "packed128": dict(max_tokens_per_micro_batch=128, packing=True),  # the 200-token row runs alone
}


def ragged_batch() -> tuple[TokenBatch, torch.Tensor]:
    """Rows of RAGGED_LENGTHS tokens (right-padded with 0), each training all but its first 3
    tokens' targets; advantages of both signs."""
    g = torch.Generator().manual_seed(11)
    s = max(RAGGED_LENGTHS)
    tokens = torch.zeros(len(RAGGED_LENGTHS), s, dtype=torch.long)
    mask = torch.zeros(len(RAGGED_LENGTHS), s - 1)
    for i, n in enumerate(RAGGED_LENGTHS):
        tokens[i, :n] = torch.randint(1, 96, (n,), generator=g)
        mask[i, min(3, n - 2) : n - 1] = 1
    return TokenBatch(tokens, mask), torch.tensor([1.0, -0.5, 0.3, 0.8, -1.2, 0.6, -0.2, 0.9])


def shape_check(folder: str, out: Path, tp: int, pp: int) -> None:
    from megatron.core import parallel_state as ps

    name, rank = Path(folder).name, int(os.environ.get("RANK", 0))
    batch, adv = ragged_batch()
    extra = json.loads(os.environ.get("PCM_SHAPE_EXTRA", "{}"))  # GPU runs: TE spec, bf16, sequence parallel
    for layout, kw in SHAPES.items():
        cfg = LearnerConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, clip_grad=0.0, **kw, **extra)
        learner = Learner(folder, cfg, seed=0)
        old = learner.logprobs(batch)
        stats = learner.train_rl(batch, old, adv, LossConfig(correction="none"), 1.0)
        grads = {learner.weights.global_name[n]: p.main_grad.clone() for n, p in learner.module.named_parameters()}
        where = {
            "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(),
            "dp": ps.get_data_parallel_rank(),
        }
        plan, _ = learner._plan(batch, cfg.max_tokens_per_micro_batch)  # each data-parallel rank's micro-batches
        counts = [len(r) for r in plan.ranks]
        torch.save(
            {**where, "grads": grads, "loss": stats["loss"], "logprobs": old, "micro_batches": counts},
            out / f"{name}-{layout}-rank{rank}.pt",
        )
    if pp > 1:  # stages own tensors of different dtypes: the export must carry each one's dtype
        learner = Learner(folder, LearnerConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp), seed=0)
        for n, p in learner.module.named_parameters():
            if "linear" in n:
                p.data = p.data.to(torch.bfloat16)
        dtypes = {k: v.dtype for k, v in learner.hf_named_tensors()}
        if rank == 0:
            torch.save(dtypes, out / f"{name}-dtypes.pt")


def rl_step(learner: Learner, b: TokenBatch) -> dict:
    return learner.train_rl(b, learner.logprobs(b), ADV, LossConfig(correction="none"), 1.0)


def main() -> None:
    out, tp, pp, mode = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ckpt_root = Path(sys.argv[5]) if mode == "resume" else out / "ckpt"
    folders = sys.argv[6:] if mode == "resume" else sys.argv[5:]
    torch.set_num_threads(1)
    if os.environ.get("PCM_BAD_GLU_SHARD"):  # negative control: fc1 = [gate; up] cut in plain row blocks
        import pc_megatron.learner.export as lm

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
        if mode == "shape":
            shape_check(folder, out, tp, pp)
            continue
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

"""The learner at real shape (CPU, gloo): ragged batches through token-budget micro-batches, padded
or packed (THD), at TP/PP/DP 1 and 2; loss aggregation; mini-batches.

The contract: one update's loss and every gradient are the same (within 1e-5 of each tensor's scale)
however the batch is cut and laid out and however the model is split, and per-row outputs come back
in the caller's order."""

import sys
from pathlib import Path

import pytest
import torch
from tensor_checks import scaled_error
from test_model_families import make_hf_model
from test_parallel import torchrun

from pc_megatron.algo import LossConfig
from pc_megatron.learner import Learner, LearnerConfig, TokenBatch
from pc_megatron.weight_sync.sharding import unshard

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from parallel_worker import RAGGED_LENGTHS, SHAPES, ragged_batch

# name: (processes, TP, PP)
LAYOUTS = {"single": (1, 1, 1), "tp2": (2, 2, 1), "pp2": (2, 1, 2), "dp2": (2, 1, 1)}
MODEL = "qwen2-tied"  # tied embeddings: at PP 2 the two copies' gradients must add up


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shape")
    folder = root / MODEL
    make_hf_model(MODEL, folder)
    for layout, (nproc, tp, pp) in LAYOUTS.items():
        torchrun(root / layout, nproc, [tp, pp, "shape", folder])
    return root


def _assemble(root: Path, layout: str, shape: str) -> tuple[dict[str, torch.Tensor], float, torch.Tensor]:
    """Full gradients (TP shards joined, stages merged, data-parallel rank 0), the loss and rank 0's
    log-probs of one layout's run."""
    shards: dict[str, dict[int, torch.Tensor]] = {}
    loss, logprobs = None, None
    for path in sorted((root / layout).glob(f"{MODEL}-{shape}-rank*.pt")):
        part = torch.load(path)
        if path.stem.endswith("rank0"):
            loss, logprobs = part["loss"], part["logprobs"]
        if part["dp"] != 0:
            continue
        for name, g in part["grads"].items():
            shards.setdefault(name, {})[part["tp"]] = g
    full = {n: unshard(n, [s[r] for r in sorted(s)]) if len(s) > 1 else s[0] for n, s in shards.items()}
    full.pop("output_layer.weight", None)  # the last stage's copy of the tied embedding (PP > 1)
    return full, loss, logprobs


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gradients_loss_and_logprobs_do_not_depend_on_cut_layout_or_parallelism(shapes, layout):
    ref_grads, ref_loss, ref_logp = _assemble(shapes, "single", "rows3")
    lengths = torch.tensor(RAGGED_LENGTHS)
    past = torch.arange(ref_logp.shape[1])[None, :] >= (lengths - 1)[:, None]
    assert ref_logp[past].abs().max() == 0 and ref_logp[~past].abs().min() > 0
    for shape in SHAPES:
        grads, loss, logp = _assemble(shapes, layout, shape)
        assert set(grads) == set(ref_grads), (layout, shape)
        assert loss == pytest.approx(ref_loss, rel=1e-5), (layout, shape)
        assert (logp - ref_logp).abs().max() < 1e-5, (layout, shape)
        worst = max((scaled_error(grads[n], ref_grads[n]), n) for n in ref_grads)
        assert worst[0] < 1e-5, (layout, shape, worst)


def test_pipeline_export_keeps_each_tensors_dtype(shapes):
    """PP 2 with bf16 linear weights and fp32 norms: every stage receives each tensor in its owner's
    dtype (the receiving stage used to allocate everything in its first parameter's dtype)."""
    dtypes = torch.load(shapes / "pp2" / f"{MODEL}-dtypes.pt")
    assert dtypes, "nothing exported"
    for name, dtype in dtypes.items():
        assert dtype == (torch.bfloat16 if "proj" in name else torch.float32), name


# ------------------------------------------------------------------ one process
def _grads(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.main_grad.clone() for n, p in learner.module.named_parameters()}


@pytest.fixture(scope="module")
def ragged_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ragged") / MODEL
    make_hf_model(MODEL, folder)
    return folder


def test_halves_normalised_apart_would_differ(ragged_model):
    """The negative control of the gradient comparison: a token mean per half (then the two halves'
    mean) is a different update from the token mean of the whole batch, far beyond 1e-5."""
    batch, adv = ragged_batch()
    whole = Learner(ragged_model, LearnerConfig(clip_grad=0.0), seed=0)
    whole.train_rl(batch, whole.logprobs(batch), adv, LossConfig(), 1.0)
    per_half = []
    for rows in (torch.arange(0, 4), torch.arange(4, 8)):
        lrn = Learner(ragged_model, LearnerConfig(clip_grad=0.0), seed=0)
        part = batch.rows(rows)
        lrn.train_rl(part, lrn.logprobs(part), adv[rows], LossConfig(), 1.0)
        per_half.append(_grads(lrn))
    mixed = {n: (per_half[0][n] + per_half[1][n]) / 2 for n in per_half[0]}
    assert max(scaled_error(mixed[n], g) for n, g in _grads(whole).items()) > 1e-3


def test_logprobs_come_back_in_the_callers_order(ragged_model):
    batch, _ = ragged_batch()
    learner = Learner(ragged_model, LearnerConfig(max_tokens_per_micro_batch=160), seed=0)
    perm = torch.tensor([5, 1, 7, 0, 3, 6, 2, 4])
    assert torch.allclose(learner.logprobs(batch.rows(perm)), learner.logprobs(batch)[perm], atol=1e-6)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregation_modes_on_the_learner_match_the_hand_computed_loss(ragged_model, agg):
    """At ratio 1 (old = current log-probs) every trained token's loss is -A_i, so the three modes
    are closed forms of the advantages and token counts; and the gradient of a mean over sequences
    is the token mean's with each advantage rescaled by (tokens / sequences) / n_i."""
    batch, adv = ragged_batch()
    n = batch.loss_mask.sum(1)
    want = {
        "token-mean": float((-adv * n).sum() / n.sum()),
        "seq-mean-token-mean": float((-adv).mean()),
        "seq-mean-token-sum-norm": float((-adv * n).sum() / (len(n) * 256)),
    }[agg]
    cfg = LearnerConfig(clip_grad=0.0, max_tokens_per_micro_batch=160)
    learner = Learner(ragged_model, cfg, seed=0)
    stats = learner.train_rl(batch, learner.logprobs(batch), adv, LossConfig(agg=agg, norm_tokens=256), 1.0)
    assert stats["loss"] == pytest.approx(want, rel=1e-5)
    scale = {
        "token-mean": torch.ones_like(n),
        "seq-mean-token-mean": n.sum() / (len(n) * n),
        "seq-mean-token-sum-norm": n.sum() / (len(n) * 256) * torch.ones_like(n),
    }[agg]
    twin = Learner(ragged_model, cfg, seed=0)
    twin.train_rl(batch, twin.logprobs(batch), adv * scale, LossConfig(), 1.0)
    twin_grads = _grads(twin)
    assert max(scaled_error(g, twin_grads[k]) for k, g in _grads(learner).items()) < 1e-5


def test_a_token_batch_knows_its_rows_lengths():
    tokens = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)
    assert TokenBatch(tokens, mask).lengths() == [4, 6, 6]  # last trained target + 1; untrained: all

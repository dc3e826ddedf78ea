"""The learner at real shape (CPU, gloo): ragged batches through token-budget micro-batches, padded
or packed (THD), at TP/PP/DP 1 and 2; loss aggregation; mini-batches.

The contract: one update's loss and every gradient are the same (within 1e-5 of each tensor's scale)
however the batch is cut and laid out and however the model is split, and per-row outputs come back
in the caller's order."""

from pathlib import Path

import pytest
import torch

from pc_megatron.algo import LossConfig
from pc_megatron.algo.config import AlgoConfig
from pc_megatron.batch import TokenBatch
from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from pc_megatron.learner import Learner, LearnerConfig
from pc_megatron.weight_sync.sharding import unshard
from tests.hf_models import make_hf_model
from tests.tensor_checks import assert_close_to_scale, scaled_error
from tests.torchrun import torchrun
from tests.workers.parallel_worker import RAGGED_LENGTHS, SHAPES, ragged_batch

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


# ------------------------------------------------------------------ mini-batches
class _Recording:
    """A learner whose every optimizer step is recorded: its statistics and the weights after it."""

    def __init__(self, learner: Learner) -> None:
        self.learner, self.steps = learner, []

    def __getattr__(self, name):
        return getattr(self.learner, name)

    def train_rl(self, *args, **kwargs):
        out = self.learner.train_rl(*args, **kwargs)
        weights = {n: p.detach().clone() for n, p in self.learner.module.named_parameters()}
        self.steps.append((dict(out), weights))
        return out


def _groups(num_groups: int, per_group: int):
    """Scheduler groups of ragged completions after prompts of 3-6 tokens, rewards mixed in each group."""
    from types import SimpleNamespace

    from pc_megatron.rollout.base import Completion
    from pc_megatron.scheduler import Group, Sample

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 96, (3 + i % 4,), generator=g).tolist() for i in range(num_groups)]
    groups = []
    for i in range(num_groups):
        samples = []
        for j in range(per_group):
            n = int(torch.randint(2, 40, (1,), generator=g))
            ids = torch.randint(1, 96, (n,), generator=g).tolist()
            completion = Completion(prompt_index=i, token_ids=ids, logprobs=[-1.0] * n, finish_reason="stop")
            samples.append(Sample(correct=j % 2 == 0, reward=float(j % 2 == 0), payload=completion, tokens=n))
        groups.append(Group(prompt=i, samples=samples))
    return groups, prompts, SimpleNamespace(pad_token_id=0)


def _algo(**kw) -> AlgoConfig:
    """The algo section for rl_update: all rows trained unless asked (skip_zero_advantage off)."""
    return AlgoConfig(**{"skip_zero_advantage": False} | kw)


def test_mini_batches_first_step_is_a_single_step_on_its_rows_and_later_steps_clip(ragged_model):
    """algo.mini_batch_size=1 on 4 groups: 4 optimizer steps from one set of old log-probs. The first
    equals one step on the first group alone; the later ones see ratios away from 1 and clip."""
    from pc_megatron.algo.advantages import group_advantages
    from pc_megatron.algo.update import rl_update
    from pc_megatron.batch import completions_to_batch
    from pc_megatron.phases import PhaseTimes

    groups, prompts, tok = _groups(4, 4)
    cfg = LearnerConfig(lr=3e-2, max_tokens_per_micro_batch=64)
    rec = _Recording(Learner(ragged_model, cfg, seed=0))
    out = rl_update(rec, None, groups, prompts, tok, _algo(mini_batch_size=1, epochs=1), 1.0, PhaseTimes())
    assert out["learner/optimizer_steps"] == 4 and len(rec.steps) == 4
    clip = [s["clipfrac"] for s, _ in rec.steps]
    assert clip[0] == 0 and max(clip[1:]) > 0, clip
    assert out["clipfrac"] == pytest.approx(sum(clip) / 4)
    assert out["learner/pad_frac"] == 0 and out["learner/micro_batches"] >= 4  # packed: no padding

    single = Learner(ragged_model, cfg, seed=0)
    payloads = [s.payload for g in groups for s in g.samples]
    batch, _ = completions_to_batch([prompts[c.prompt_index] for c in payloads], payloads, 0)
    rows = torch.arange(4)  # the first group's samples
    rewards = torch.tensor([s.reward for g in groups for s in g.samples])
    adv = group_advantages(rewards, torch.arange(4).repeat_interleave(4), True)
    old = single.logprobs(batch)
    single.train_rl(batch.rows(rows), old[rows], adv[rows], LossConfig(), 1.0)
    first = rec.steps[0][1]
    for n, p in single.module.named_parameters():
        assert torch.allclose(p, first[n], atol=1e-6), n
    # the step did move the weights (so the comparison above can fail)
    assert any(not torch.allclose(p, rec.steps[1][1][n]) for n, p in single.module.named_parameters())


def test_two_epochs_take_every_mini_batch_twice(ragged_model):
    from pc_megatron.algo.update import rl_update
    from pc_megatron.phases import PhaseTimes

    groups, prompts, tok = _groups(4, 2)
    rec = _Recording(Learner(ragged_model, LearnerConfig(lr=1e-3), seed=0))
    out = rl_update(rec, None, groups, prompts, tok, _algo(mini_batch_size=2, epochs=2), 1.0, PhaseTimes())
    assert out["learner/optimizer_steps"] == 4 == rec.learner.version


def test_mini_batches_sized_in_rollouts_take_the_public_recipes_extra_steps(ragged_model):
    """The paper's public recipe sizes a mini-batch as 32 prompts x n_c rollouts. Pilot-Commit trains
    n_p + n_c rollouts a prompt, so the same batch of prompts takes more optimizer steps than GRPO's:
    here 4 prompts of 2 + 4 rollouts, mini-batches of 2 x 4 rollouts: 3 steps where 2 prompts a
    mini-batch take 2. A group may straddle two mini-batches; every row is trained once."""
    from pc_megatron.algo.update import mini_batches, rl_update
    from pc_megatron.phases import PhaseTimes

    groups, prompts, tok = _groups(4, 6)
    parts = mini_batches(groups, 0, mini_batch_rollouts=8)
    assert [len(p) for p in parts] == [8, 8, 8] and torch.equal(torch.cat(parts), torch.arange(24))
    assert [len(p) for p in mini_batches(groups, 2)] == [12, 12]
    rec = _Recording(Learner(ragged_model, LearnerConfig(lr=1e-3), seed=0))
    out = rl_update(rec, None, groups, prompts, tok, _algo(mini_batch_rollouts=8), 1.0, PhaseTimes())
    assert out["learner/optimizer_steps"] == 3 == rec.learner.version
    with pytest.raises(ConfigError, match="set one of them"):
        load_config("tiny", ["algo.mini_batch_size=2", "algo.mini_batch_rollouts=8"])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rows_of_all_alike_groups_skipped_give_the_same_step_at_less_compute(ragged_model, agg):
    """algo.skip_zero_advantage: two of four groups all alike (advantage 0). Leaving their rows out
    of the forward and backward gives the weights the full batch gives (the loss keeps the whole
    batch's divisor), and trains half the tokens."""
    from pc_megatron.algo.update import rl_update
    from pc_megatron.phases import PhaseTimes

    groups, prompts, tok = _groups(4, 4)
    for g, value in ((groups[1], 1.0), (groups[3], 0.0)):
        for s in g.samples:
            s.reward, s.correct = value, bool(value)
    loss = LossConfig(agg=agg)
    results = {}
    for skip in (False, True):
        learner = Learner(ragged_model, LearnerConfig(lr=1e-3, clip_grad=0.0, max_tokens_per_micro_batch=64), seed=0)
        out = rl_update(
            learner, None, groups, prompts, tok, _algo(loss=loss, skip_zero_advantage=skip), 1.0, PhaseTimes()
        )
        # the step's gradients (Adam's first step amplifies float noise where a gradient is ~0: compare these)
        results[skip] = (out, {n: p.main_grad.clone() for n, p in learner.module.named_parameters()})
    (full, g_full), (skipped, g_skip) = results[False], results[True]
    assert skipped["loss"] == pytest.approx(full["loss"], rel=1e-5)
    for n, g in g_full.items():
        assert_close_to_scale(g_skip[n], g, 1e-5, n)
    assert max(float(g.abs().max()) for g in g_full.values()) > 0
    # half the rows trained: fewer micro-batches (64-token budget) for the same step
    assert skipped["learner/micro_batches"] < full["learner/micro_batches"]
    # the negative control: the same rows trained without the whole batch's divisor differ
    learner = Learner(ragged_model, LearnerConfig(lr=1e-3, clip_grad=0.0, max_tokens_per_micro_batch=64), seed=0)
    from pc_megatron.algo.advantages import group_advantages
    from pc_megatron.batch import completions_to_batch

    payloads = [s.payload for g in groups for s in g.samples]
    batch, _ = completions_to_batch([prompts[c.prompt_index] for c in payloads], payloads, 0)
    rewards = torch.tensor([s.reward for g in groups for s in g.samples])
    adv = group_advantages(rewards, torch.arange(4).repeat_interleave(4), True)
    rows = torch.cat([torch.arange(0, 4), torch.arange(8, 12)])
    learner.train_rl(batch.rows(rows), None, adv[rows], loss, 1.0)
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    assert scaled_error(learner.module.get_parameter(name).main_grad, g_full[name]) > 1e-2


def test_rows_to_train_keeps_one_row_per_data_parallel_rank():
    from pc_megatron.algo.update import _rows_to_train

    part = torch.arange(4, 12)
    adv = torch.zeros(16)
    adv[9] = 0.5
    mask = torch.ones(16, 10)
    mask[7, 3:] = 0  # the shortest zero-advantage row
    assert _rows_to_train(part, adv, mask, 1).tolist() == [9]
    assert _rows_to_train(part, adv, mask, 2).tolist() == [7, 9]  # topped up with the shortest
    assert _rows_to_train(part, torch.zeros(16), mask, 2).tolist() == [4, 7]
    mask[4] = 0  # a row with no trained token is never the one kept: the step would have nothing to train
    assert _rows_to_train(part, torch.zeros(16), mask, 1).tolist() == [7]
    assert len(_rows_to_train(torch.arange(1), torch.zeros(16), mask, 2)) == 1

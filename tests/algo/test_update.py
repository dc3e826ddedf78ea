"""One RL update (``pc_megatron/algo/update.py``) on the learner at real shape (CPU): mini-batches by groups
or by rollouts over several epochs, and the rows of all-alike groups left out."""

import pytest
import torch

from pc_megatron.algo.config import AlgoConfig, LossConfig
from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from tests.tensor_checks import assert_close_to_scale, scaled_error


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
    """The algo section for rl_update: all rows trained unless asked (skip_zero_advantage off), no
    behaviour correction (the completions' log-probs here are placeholders, not a policy's)."""
    return AlgoConfig(**{"skip_zero_advantage": False, "loss": LossConfig(correction="none")} | kw)


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
    single.train_rl(batch.rows(rows), old[rows], adv[rows], LossConfig(correction="none"), 1.0)
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
    loss = LossConfig(agg=agg, correction="none")
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

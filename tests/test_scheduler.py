"""Scheduler properties with a synthetic pass-rate oracle (hypothesis), CPU only."""

import dataclasses
import pickle
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pc_megatron.scheduler import Sample, Scheduler, SchedulerConfig
from tests.settings import FIXTURES


class Oracle:
    """Prompt i is correct with probability p_i; the k-th sample ever drawn for a prompt is a
    fixed function of (seed, i, k), so any call order gives each prompt the same outcomes."""

    def __init__(self, num_prompts: int, seed: int):
        rng = random.Random(seed)
        # the paper's regime: many prompts solved or hopeless, some in between
        self.p = [rng.choice([0.0, 0.0, 0.05, 0.3, 0.5, 0.7, 0.95, 1.0, 1.0]) for _ in range(num_prompts)]
        self.drawn = [0] * num_prompts
        self.seed = seed
        self.version = 0
        self.requests = []

    def __call__(self, requests):
        self.requests.append([(r.prompt, r.n, r.phase, self.version) for r in requests])
        out = []
        for r in requests:
            samples = []
            for _ in range(r.n):
                u = random.Random(f"{self.seed}/{r.prompt}/{self.drawn[r.prompt]}").random()
                self.drawn[r.prompt] += 1
                ok = u < self.p[r.prompt]
                tokens = 1 + (r.prompt + self.drawn[r.prompt]) % 5
                samples.append(Sample(correct=ok, reward=float(ok), policy_version=self.version, tokens=tokens))
            out.append(samples)
        return out


def run(cfg, steps, num_prompts=40, B=4, n=8, seed=0, oracle_seed=1):
    sched, oracle = Scheduler(cfg, num_prompts, B, n, seed), Oracle(num_prompts, oracle_seed)
    history = []
    for step in range(steps):
        oracle.version = step
        batch = sched.next_batch(step, oracle, policy_version=step)
        buffered_tokens = sum(s.tokens for e in [*sched.pool.buffer.values(), *sched.policy.pending] for s in e.samples)
        history.append(
            (batch, dict(sched.pool.counts), dict(sched.pool.state), sched.buffered_samples(), buffered_tokens)
        )
    return sched, oracle, history


configs = st.builds(
    SchedulerConfig,
    policy=st.sampled_from(["grpo", "dapo", "pilot_commit", "adaptive"]),
    gen_prompts_multiplier=st.integers(1, 3),
    buffer_capacity=st.integers(0, 12),
    max_off_steps=st.integers(0, 4),
    selection=st.sampled_from(["random", "max_variance"]),
    bind=st.booleans(),
    max_rounds=st.integers(1, 4),
    request_multiple=st.sampled_from([1, 1, 3, 8]),
)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cfg=configs, steps=st.integers(1, 25), seed=st.integers(0, 5))
def test_accounting_and_pool_invariants(cfg, steps, seed):
    sched, oracle, history = run(cfg, steps, seed=seed)
    wasted = ("wasted_filtered", "wasted_flushed", "wasted_surplus", "wasted_degenerate")
    for batch, counts, state, buffered, buffered_tokens in history:
        # every generated rollout (and token) is trained, wasted, or still waiting in the buffer
        assert counts["generated"] == counts["trained"] + sum(counts[k] for k in wasted) + buffered
        st_ = batch.stats
        assert st_["cum_tokens_generated"] == (
            st_["cum_tokens_trained"] + sum(st_[f"cum_tokens_{k}"] for k in wasted) + buffered_tokens
        )
        assert st_["step_tokens_trained"] == sum(s.tokens for g in batch.groups for s in g.samples)
        assert st_["pool_active"] + st_["pool_evicted"] == 40
        assert st_["pool_deferred"] == sum(s == "deferred" for s in state.values())
        assert st_["buffer_age_max"] <= cfg.max_off_steps
        assert len(batch.groups) <= 4 and len({g.prompt for g in batch.groups}) == len(batch.groups)
        assert all(len(g.samples) == 8 for g in batch.groups)  # trained group = n samples (pilot ∪ commit)
        assert set(state.values()) <= {"fresh", "buffered", "used", "deferred", "evicted"}  # one state per prompt
    assert {p for p, s in sched.pool.state.items() if s == "buffered"} == set(sched.pool.buffer)
    # an evicted prompt is never requested in a later step
    evicted_at = {}
    for step, (_, _, state, *_) in enumerate(history):
        for p, s in state.items():
            if s == "evicted":
                evicted_at.setdefault(p, step)
    for call in oracle.requests:
        for prompt, _, _, version in call:
            assert prompt not in evicted_at or version <= evicted_at[prompt]


@SETTINGS
@given(cfg=configs, seed=st.integers(0, 5))
def test_no_trained_rollout_is_older_than_the_staleness_bound(cfg, seed):
    _, _, history = run(cfg, 20, seed=seed)
    bound = cfg.max_off_steps + 1  # flushed after step t when generated before t - max_off_steps
    for step, (batch, *_) in enumerate(history):
        for g in batch.groups:
            assert all(step - s.policy_version <= bound for s in g.samples)


@SETTINGS
@given(cfg=configs.filter(lambda c: c.policy == "pilot_commit"), seed=st.integers(0, 5))
def test_bound_and_unbound_train_on_the_same_prompts(cfg, seed):
    # without rounding: it pads bound calls (commits + pilots) and unbound pilot calls differently;
    # without flushes: a bound pilot is generated one call earlier, so it is flushed a step earlier
    bound = dataclasses.replace(cfg, bind=True, request_multiple=1, max_off_steps=100)
    unbound = dataclasses.replace(cfg, bind=False, request_multiple=1, max_off_steps=100)
    _, _, h1 = run(bound, 15, seed=seed)
    _, _, h2 = run(unbound, 15, seed=seed)
    for (b1, *_), (b2, *_) in zip(h1, h2, strict=True):
        assert [g.prompt for g in b1.groups] == [g.prompt for g in b2.groups]
        assert [[s.correct for s in g.samples] for g in b1.groups] == [
            [s.correct for s in g.samples] for g in b2.groups
        ]


@SETTINGS
@given(cfg=configs, seed=st.integers(0, 5), cut=st.integers(1, 12))
def test_resuming_from_any_step_reproduces_the_uninterrupted_run(cfg, seed, cut):
    _, _, full = run(cfg, 16, seed=seed)
    sched, oracle, _ = run(cfg, cut, seed=seed)
    saved = pickle.dumps((sched.state_dict(), oracle.drawn))
    state, drawn = pickle.loads(saved)
    fresh = Scheduler(cfg, 40, 4, 8, seed)
    fresh.load_state_dict(state)
    oracle2 = Oracle(40, 1)
    oracle2.drawn = drawn
    rest = []
    for step in range(cut, 16):
        oracle2.version = step
        rest.append(fresh.next_batch(step, oracle2, policy_version=step))
    for a, b in zip([h[0] for h in full[cut:]], rest, strict=True):
        assert [(g.prompt, [s.correct for s in g.samples]) for g in a.groups] == [
            (g.prompt, [s.correct for s in g.samples]) for g in b.groups
        ]
        assert a.stats == b.stats


def test_deferred_prompts_come_back_next_epoch_and_evicted_never_do():
    cfg = SchedulerConfig(policy="pilot_commit", bind=False, gen_prompts_multiplier=3, evict_min_pass_rate=0.0)
    sched, oracle, _ = run(cfg, 60, num_prompts=24)
    assert sched.pool.epoch >= 3
    pilots = [p for call in oracle.requests for p, _, phase, _ in call if phase == "pilot"]
    # p = 0: always below p_lower, so deferred each epoch and piloted again in the next
    for p in (i for i, q in enumerate(oracle.p) if q == 0.0):
        assert sched.pool.state[p] != "evicted" and pilots.count(p) >= sched.pool.epoch - 1
    # p = 1: all pilot samples correct, evicted at the first pilot, never requested again
    for p in (i for i, q in enumerate(oracle.p) if q == 1.0):
        assert sched.pool.state[p] == "evicted" and pilots.count(p) == 1


def test_binding_puts_commit_and_next_pilot_in_one_call():
    cfg = SchedulerConfig(policy="pilot_commit", max_rounds=1)
    _, bound, _ = run(dataclasses.replace(cfg, bind=True), 10)
    _, unbound, _ = run(dataclasses.replace(cfg, bind=False), 10)
    assert len(bound.requests) == 1 + 10  # one pilot-only warm-up call, then one call per step
    assert all({ph for _, _, ph, _ in call} <= {"commit", "pilot"} for call in bound.requests)
    assert sum({ph for _, _, ph, _ in call} == {"commit", "pilot"} for call in bound.requests) >= 5
    assert len(unbound.requests) > len(bound.requests)  # separate pilot and commit calls


def test_grpo_is_uniform_and_dapo_drops_degenerate_groups():
    _, _, h = run(SchedulerConfig(policy="grpo"), 3)
    assert all(len(b.groups) == 4 and b.rounds == 1 for b, *_ in h)
    _, _, h = run(SchedulerConfig(policy="dapo"), 5)
    for b, *_ in h:
        assert all(len({s.reward for s in g.samples}) > 1 for g in b.groups)


def test_degenerate_groups_are_counted_per_phase():
    """compare.json's "degenerate at start" comes from these counters: a group whose rewards are
    all equal, counted over full groups (GRPO, DAPO) and pilots (Pilot-Commit) separately."""
    for policy, phase in (("grpo", "full"), ("dapo", "full"), ("pilot_commit", "pilot")):
        sched, oracle, _ = run(SchedulerConfig(policy=policy), 4)
        groups = degenerate = 0
        for call in oracle.requests:
            for prompt, _n, ph, _ in call:
                if ph == phase:
                    groups += 1
                    degenerate += oracle.p[prompt] in (0.0, 1.0)
        assert sched.pool.counts[f"groups_{phase}"] == groups > 0
        # p in {0, 1} is always degenerate; p in (0, 1) sometimes is, by chance
        assert sched.pool.counts[f"degenerate_{phase}"] >= degenerate
        other = "pilot" if phase == "full" else "full"
        assert sched.pool.counts[f"groups_{other}"] == 0


@SETTINGS
@given(cfg=configs.filter(lambda c: c.policy != "grpo"), seed=st.integers(0, 5))
def test_generate_calls_are_rounded_to_the_request_multiple(cfg, seed):
    """With request_multiple = the engine's DP size, every call that draws fresh prompts fills
    whole replicas (only the last calls of an exhausted pool may fall short)."""
    cfg = dataclasses.replace(cfg, request_multiple=3)
    _, oracle, _ = run(cfg, 8, num_prompts=400, seed=seed)
    for call in oracle.requests:
        pilot_call = any(ph == "pilot" for _, _, ph, _ in call)
        if cfg.policy == "dapo" or (cfg.bind and cfg.policy == "pilot_commit") or pilot_call:
            assert len(call) % 3 == 0, [ph for _, _, ph, _ in call]


def test_pilot_histogram_counts_every_filed_pilot():
    """Unbound, every pilot is filed in the step that generated it."""
    sched, oracle, history = run(SchedulerConfig(policy="pilot_commit", bind=False), 6)
    pilots = sum(ph == "pilot" for call in oracle.requests for _, _, ph, _ in call)
    assert sum(sum(b.stats["pilot_hist"]) for b, *_ in history) == pilots > 0
    assert all(len(b.stats["pilot_hist"]) == sched.n_p + 1 for b, *_ in history)


def test_bad_config_is_rejected():
    from pc_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="scheduler.policy: 'ppo' is not one of grpo, dapo, pilot_commit"):
        Scheduler(SchedulerConfig(policy="ppo"), 10, 2, 8, 0)
    with pytest.raises(ConfigError, match="leaves no commit samples"):
        Scheduler(SchedulerConfig(policy="pilot_commit", pilot_samples=8), 10, 2, 8, 0)
    with pytest.raises(ConfigError, match="p_lower <= p_upper"):
        Scheduler(SchedulerConfig(p_lower=0.9, p_upper=0.1), 10, 2, 8, 0)


def test_pass_rate_lower_bound_matches_the_closed_form_and_guards_eviction():
    from pc_megatron.scheduler import pass_rate_lower_bound

    for n in (2, 8, 32):  # all correct: (1 - confidence) ** (1 / n)
        assert abs(pass_rate_lower_bound(n, n) - 0.05 ** (1 / n)) < 1e-9
    assert pass_rate_lower_bound(0, 8) == 0.0
    assert pass_rate_lower_bound(4, 8) < 0.5 < pass_rate_lower_bound(8, 8)
    # the recipe's rule evicts every prompt whose 2-sample pilot is all correct; the guard does not
    cfg = SchedulerConfig(policy="pilot_commit", pilot_samples=2, bind=False, evict_min_pass_rate=0.0)
    evicting, _, _ = run(cfg, 10)
    guarded, _, _ = run(dataclasses.replace(cfg, evict_min_pass_rate=0.9), 10)
    assert evicting.pool.counts["evicted"] > 0 and guarded.pool.counts["evicted"] == 0
    # the default scales the guard with the pilot: on below 16 samples, the recipe's rule from 16 on
    auto = dataclasses.replace(cfg, evict_min_pass_rate=-1.0)
    assert Scheduler(auto, 40, 4, 8, 0).policy.evict_guard == 0.9
    assert Scheduler(dataclasses.replace(auto, pilot_samples=16), 40, 4, 64, 0).policy.evict_guard == 0.0
    # with 32-sample pilots the guard lets all-correct pilots evict, as the recipe does at n = 128
    big, _, _ = run(dataclasses.replace(cfg, pilot_samples=32, evict_min_pass_rate=0.9), 5, n=64)
    assert big.pool.counts["evicted"] > 0


@SETTINGS
@given(cfg=configs.filter(lambda c: c.policy == "pilot_commit"), seed=st.integers(0, 5))
def test_every_pilot_carries_the_step_that_generated_it(cfg, seed):
    """Bound pilots of a step's last call, of its earlier rounds and of a pilot-only call all
    carry the generating step, so they age (and are flushed) alike; the buffer size counts
    bound pilots still pending."""
    sched, oracle = Scheduler(cfg, 40, 4, 8, seed), Oracle(40, 1)
    for step in range(12):
        oracle.version = step
        batch = sched.next_batch(step, oracle, policy_version=step)
        assert all(e.gen_step == step for e in sched.policy.pending)
        assert all(step - cfg.max_off_steps <= e.gen_step <= step for e in sched.pool.buffer.values())
        assert batch.stats["buffer_size"] == len(sched.pool.buffer) + len(sched.policy.pending)
        for g in batch.groups:  # a group's pilot samples came from the step its entry carried
            assert len({s.policy_version for s in g.samples[: g.pilot_samples]}) == 1


def _rollouts_per_mixed_group(policy: str, probs: list[float], steps: int = 30) -> tuple[float, float]:
    """(rollouts generated per trained group with both right and wrong samples, pilot share)."""
    cfg = SchedulerConfig(policy=policy, bind=False)
    sched, oracle = Scheduler(cfg, 400, 8, 32, 0), Oracle(400, 1)
    oracle.p = [random.Random(i).choice(probs) for i in range(400)]
    mixed = 0
    for step in range(steps):
        oracle.version = step
        batch = sched.next_batch(step, oracle, policy_version=step)
        mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
    return sched.pool.counts["generated"] / max(mixed, 1), sched.pool.counts["generated_pilot"] / sched.pool.counts[
        "generated"
    ]


def test_adaptive_spends_little_where_groups_degenerate_and_nothing_extra_where_they_do_not():
    """With fixed pass rates (the oracle): in a pool of 70% solved or hopeless prompts, adaptive
    needs far fewer rollouts per informative trained group than GRPO and fewer than the paper's
    Pilot-Commit; in a pool where every group is informative it allocates exactly as GRPO."""
    graded = [0.0] * 45 + [1.0] * 25 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
    grpo, _ = _rollouts_per_mixed_group("grpo", graded)
    paper, _ = _rollouts_per_mixed_group("pilot_commit", graded)
    adaptive, _ = _rollouts_per_mixed_group("adaptive", graded)
    assert adaptive * 2 < grpo and adaptive * 1.2 < paper, (grpo, paper, adaptive)
    informative = [0.3, 0.5, 0.7]
    grpo, _ = _rollouts_per_mixed_group("grpo", informative)
    adaptive, pilot_share = _rollouts_per_mixed_group("adaptive", informative)
    assert adaptive == grpo and pilot_share == 0.0


def test_adaptive_spends_at_most_grpos_rollouts_per_update_and_trains_more_informative_groups():
    """The budget: adaptive never generates more than GRPO's B x n rollouts in a step, and for them
    trains more groups with both right and wrong samples than GRPO does (on a pool of 70% solved or
    hopeless prompts); without the cap (``adaptive_budget=0``) it fills B groups and spends more."""
    graded = [0.0] * 45 + [1.0] * 25 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
    B, n, steps = 8, 32, 30

    def run(policy: str, budget: float) -> tuple[list[int], int, int]:
        sched = Scheduler(SchedulerConfig(policy=policy, bind=False, adaptive_budget=budget), 400, B, n, 0)
        oracle = Oracle(400, 1)
        oracle.p = [random.Random(i).choice(graded) for i in range(400)]
        spent, groups, mixed = [], 0, 0
        for step in range(steps):
            oracle.version = step
            batch = sched.next_batch(step, oracle, policy_version=step)
            spent.append(batch.stats["step_generated"])
            groups += len(batch.groups)
            mixed += sum(0 < sum(s.correct for s in g.samples) < len(g.samples) for g in batch.groups)
        return spent, groups, mixed

    grpo_spent, _, grpo_mixed = run("grpo", 1.0)
    spent, groups, mixed = run("adaptive", 1.0)
    assert max(spent) <= B * n and sum(spent) > 0.8 * sum(grpo_spent), spent
    assert mixed > 1.5 * grpo_mixed and groups <= B * steps, (mixed, grpo_mixed, groups, spent)
    uncapped, groups, _ = run("adaptive", 0.0)
    assert max(uncapped) > B * n and groups > 0.95 * B * steps, uncapped


def test_adaptive_skips_prompts_it_knows_are_saturated_when_they_are_nearly_so():
    """Real "hopeless" prompts are rarely exactly p = 0 (nor solved ones exactly 1): with pass
    rates within 0.5% of 0 or 1, the posterior learns over epochs of a small pool that such a
    prompt's 32-group will be all alike, and skips it; a prompt at p = 1% is not skipped, since its
    32-group is mixed 27% of the time, above ``adaptive_skip_below`` (the graded pool's
    "hopeless" prompts, p < 0.02, are mostly of that kind: docs/LOG.md, 2026-12-04)."""

    def skipped(hopeless: list[float], solved: list[float]) -> int:
        rates = hopeless * 15 + solved * 8 + [0.1, 0.3, 0.5, 0.7, 0.9] * 6
        sched, oracle = Scheduler(SchedulerConfig(policy="adaptive", bind=False), 200, 8, 32, 0), Oracle(200, 1)
        oracle.p = [random.Random(i).choice(rates) for i in range(200)]
        for step in range(60):
            oracle.version = step
            sched.next_batch(step, oracle, policy_version=step)
        assert sched.pool.epoch >= 3
        return sched.pool.counts["skipped_confident"]

    assert skipped([0.0, 0.002, 0.005], [1.0, 0.998, 0.995]) > 100
    assert skipped([0.01] * 3, [0.99] * 3) == 0


def test_a_checkpoint_written_before_the_policy_objects_loads_and_continues_identically():
    """``fixtures/scheduler_state_mixins.pkl`` holds, for a bound pilot_commit run and an adaptive
    run, a scheduler state dict as the scheduler of commit 9807949 wrote it (before the policies
    became objects; pickled as ``torch.save`` pickles it into a checkpoint), the oracle's draw counts
    then, and what that scheduler did next: the following steps' groups and stats and its final state
    dict. A scheduler of today loads it, does the same, and writes the same dict."""
    with open(FIXTURES / "scheduler_state_mixins.pkl", "rb") as f:
        fixture = pickle.load(f)
    for name, saved in fixture.items():
        assert saved["state_dict"]["pending"] and saved["state_dict"]["buffer"], name  # both kinds of entry
        sched = Scheduler(SchedulerConfig(**saved["config"]), 40, 4, 8, 0)
        sched.load_state_dict(saved["state_dict"])
        assert sched.state_dict() == saved["state_dict"], name
        oracle = Oracle(40, 1)
        oracle.drawn = list(saved["drawn"])
        for step, (groups, stats) in enumerate(saved["expected"], start=saved["step"]):
            oracle.version = step
            batch = sched.next_batch(step, oracle, policy_version=step)
            assert [(g.prompt, [s.correct for s in g.samples], g.pilot_samples) for g in batch.groups] == groups
            assert batch.stats == stats, (name, step)
        assert sched.state_dict() == saved["state_dict_after"], name

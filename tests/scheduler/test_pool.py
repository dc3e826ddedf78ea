"""The prompt pool (``pc_megatron/scheduler/pool.py``) under every policy, with a synthetic pass-rate oracle
(hypothesis): its books balance, no trained rollout is staler than the bound, deferred prompts come
back and evicted ones never do, degenerate groups are counted per phase."""

from hypothesis import given
from hypothesis import strategies as st

from pc_megatron.scheduler import SchedulerConfig
from tests.scheduler.oracle import SETTINGS, configs, run


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

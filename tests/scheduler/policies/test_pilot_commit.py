"""Pilot-Commit (``pc_megatron/scheduler/policies/pilot_commit.py``): bound and unbound modes train on the
same prompts, binding shares one call between commit and next pilot, every pilot is filed and carries
its step, and the pass-rate lower bound guards eviction."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from pc_megatron.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.oracle import SETTINGS, Oracle, configs, run


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


def test_binding_puts_commit_and_next_pilot_in_one_call():
    cfg = SchedulerConfig(policy="pilot_commit", max_rounds=1)
    _, bound, _ = run(dataclasses.replace(cfg, bind=True), 10)
    _, unbound, _ = run(dataclasses.replace(cfg, bind=False), 10)
    assert len(bound.requests) == 1 + 10  # one pilot-only warm-up call, then one call per step
    assert all({ph for _, _, ph, _ in call} <= {"commit", "pilot"} for call in bound.requests)
    assert sum({ph for _, _, ph, _ in call} == {"commit", "pilot"} for call in bound.requests) >= 5
    assert len(unbound.requests) > len(bound.requests)  # separate pilot and commit calls


def test_pilot_histogram_counts_every_filed_pilot():
    """Unbound, every pilot is filed in the step that generated it."""
    sched, oracle, history = run(SchedulerConfig(policy="pilot_commit", bind=False), 6)
    pilots = sum(ph == "pilot" for call in oracle.requests for _, _, ph, _ in call)
    assert sum(sum(b.stats["pilot_hist"]) for b, *_ in history) == pilots > 0
    assert all(len(b.stats["pilot_hist"]) == sched.n_p + 1 for b, *_ in history)


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

"""The scheduler (``pc_megatron/scheduler/core.py``): resumed from any step's state it continues exactly,
and a checkpoint written before the policies became objects loads and continues identically."""

import pickle

from hypothesis import given
from hypothesis import strategies as st

from pc_megatron.scheduler import Scheduler, SchedulerConfig
from tests.scheduler.oracle import SETTINGS, Oracle, configs, run
from tests.settings import FIXTURES


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


def test_a_checkpoint_written_before_the_policy_objects_loads_and_continues_identically():
    """``tests/fixtures/scheduler_state_mixins.pkl`` holds, for a bound pilot_commit run and an adaptive
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

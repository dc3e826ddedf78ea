"""GRPO and DAPO (``pc_megatron/scheduler/policies/grpo.py``, ``dapo.py``): GRPO is uniform, DAPO drops
degenerate groups."""

from pc_megatron.scheduler import SchedulerConfig
from tests.scheduler.oracle import run


def test_grpo_is_uniform_and_dapo_drops_degenerate_groups():
    _, _, h = run(SchedulerConfig(policy="grpo"), 3)
    assert all(len(b.groups) == 4 and b.rounds == 1 for b, *_ in h)
    _, _, h = run(SchedulerConfig(policy="dapo"), 5)
    for b, *_ in h:
        assert all(len({s.reward for s in g.samples}) > 1 for g in b.groups)

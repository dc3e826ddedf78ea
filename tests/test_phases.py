"""Phase timing (``pc_megatron/phases.py``): nested phases are exclusive."""

from __future__ import annotations

import time

from pc_megatron.phases import PhaseTimes


def test_phase_times_are_exclusive():
    times = PhaseTimes()
    with times("outer"):
        time.sleep(0.05)
        with times("inner"):
            time.sleep(0.1)
    assert 0.04 < times.seconds["outer"] < 0.09 and times.seconds["inner"] >= 0.1
    assert set(times.metrics()) == {"time_outer_s", "time_inner_s"}

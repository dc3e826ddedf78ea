"""What the policies share (``pc_megatron/scheduler/policies/base.py``): every call that draws fresh prompts
is rounded to the request multiple."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from tests.scheduler.oracle import SETTINGS, configs, run


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

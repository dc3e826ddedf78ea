"""Opening a run (``pc_megatron/run/setup.py``): what one process cannot hold is said before anything
starts, after the model's own layout (the first thing to fix)."""

from __future__ import annotations

import pytest

from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from pc_megatron.run.setup import preflight


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("learner.pipeline_parallel_size=2", "learner TP x PP x DP = 2 ranks need runtime=ray"),
        ("learner.data_parallel_size=2", "learner TP x PP x DP = 2 ranks need runtime=ray"),
        ("rollout.replicas=2", "rollout.replicas > 1 needs runtime=ray"),
        ("learner.tensor_parallel_size=3", "does not divide"),  # the layout's reason first
    ],
)
def test_what_one_process_cannot_hold_is_refused_before_anything_starts(tiny_model_dir, override, expected):
    with pytest.raises(ConfigError, match=expected):
        preflight(load_config("tiny", [override]), tiny_model_dir)
    preflight(
        load_config("tiny", [override, "runtime=ray"]) if "=3" not in override else load_config("tiny"), tiny_model_dir
    )

"""Config loading (``pc_megatron/config.py``): recipes, inheritance, overrides, and one-line errors for bad
keys and values."""

from __future__ import annotations

import pytest

from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError


def test_recipes_load_and_overrides_apply():
    cfg = load_config("tiny", ["learner.lr=1e-4", "algo.samples_per_prompt=4"])
    assert cfg.learner.lr == 1e-4 and cfg.algo.samples_per_prompt == 4
    assert load_config("deepmath-1.5b").learner.bf16 is True


@pytest.mark.parametrize(
    "override, expected",
    [
        ("learner.lrr=1", "unknown config key 'learner.lrr'; did you mean learner.lr"),
        ("samples_per_prompt=4", "algo.samples_per_prompt"),
        ("learner.lr=fast", "bad value for 'learner.lr'"),
        ("algo.prompts_per_step=0", "algo.prompts_per_step must be > 0"),
        ("rollout.backend=sglang", "rollout.backend: 'sglang' is not one of hf, vllm"),
        ("rollout.vllm.sleep_level=3", "rollout.vllm.sleep_level must be 0 (never), 1 (offload weights) or 2"),
        ("rollout.weight_sync.transport=nccl", "rollout.weight_sync.transport: 'nccl' is not one of"),
        ("rollout.vllm.dtype=fp8", "rollout.vllm.dtype: 'fp8' is not one of"),
        ("data.synthetic.mix.div9=1", "unknown family ['div9']"),
        ("learner.pipeline_parallel_size=0", "learner.pipeline_parallel_size must be >= 1"),
        ("scheduler.policy=ppo", "scheduler.policy: 'ppo' is not one of"),
        ("scheduler.pilot_samples=8", "scheduler.pilot_samples must be < algo.samples_per_prompt"),
        ("learner.fp8=hybrid", "learner.fp8 needs learner.bf16=true"),
        ("learner.sequence_parallel=true", "learner.sequence_parallel needs learner.tensor_parallel_size > 1"),
        ("data.synthetic.pool=medium", "data.synthetic.pool: 'medium' is not one of hard, easy, graded"),
        ("data.synthetic.easy_pass_band=[0.8,0.2]", "data.synthetic.easy_pass_band must be [low, high]"),
        ("name=../elsewhere", "name='../elsewhere': a run's folder name inside out_dir"),
        ("name=/etc/runs", "name='/etc/runs': a run's folder name inside out_dir"),
        ("rollout.weight_sync.transport=broadcast", "transport=broadcast needs runtime=ray"),
        ("learner.lr_decay_style=step", "learner.lr_decay_style: 'step' is not one of constant, linear, cosine"),
        ("reward.name=exact", "reward.name: 'exact' is not one of integer_match, math_verify"),
    ],
)
def test_bad_config_fails_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", [override])
    assert expected in str(e.value)


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(ConfigError, match="recipe 'nope' not found.*tiny"):
        load_config("nope")


def test_a_cycle_of_inheriting_recipes_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("inherit: b.yaml\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\n")
    with pytest.raises(ConfigError, match="makes a cycle"):
        load_config(str(tmp_path / "a.yaml"))

"""Config loading: recipes, overrides, and one-line errors for bad keys and values."""

import subprocess
import sys

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
        ("data.synthetic.pool=medium", "data.synthetic.pool: unknown pool 'medium'; valid pools: hard, easy"),
        ("data.synthetic.easy_pass_band=[0.8,0.2]", "data.synthetic.easy_pass_band must be [low, high]"),
    ],
)
def test_bad_config_fails_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as e:
        load_config("tiny", [override])
    assert expected in str(e.value)


def test_unknown_recipe_lists_the_known_ones():
    with pytest.raises(ConfigError, match="recipe 'nope' not found.*tiny"):
        load_config("nope")


def test_cli_prints_one_error_line_without_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "pc_megatron.cli", "train", "learner.lrr=1"], capture_output=True, text=True
    )
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert lines == [
        "error: override 'learner.lrr=1': unknown config key 'learner.lrr'; did you mean "
        "learner.lr, learner.min_lr, learner.fp8?"
    ]


def test_config_show_prints_resolved_yaml():
    out = subprocess.run(
        [sys.executable, "-m", "pc_megatron.cli", "config", "show", "tiny", "seed=7"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "seed: 7" in out.stdout and "prompts_per_step: 64" in out.stdout


def test_default_recipe_uses_the_shipped_warm_start():
    """A change to the tiny recipe or the SFT procedure that orphans the shipped warm-start
    would make the default run retrain it (~7 min): re-ship with `pc-megatron warmstart --ship`."""
    from pc_megatron.model.arch import load_arch
    from pc_megatron.prepare import initial_policy_dir
    from pc_megatron.warmstart import SHIPPED

    path = initial_policy_dir(load_config("tiny"))
    assert path.parent == SHIPPED and (path / "model.safetensors").is_file()
    assert load_arch(path).hidden_size == 256
    # the RL pool does not change the SFT rows, so both pools start from the shipped warm-start
    assert initial_policy_dir(load_config("tiny", ["data.synthetic.pool=easy"])) == path

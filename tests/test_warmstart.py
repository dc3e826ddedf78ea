"""The SFT warm-start (``pc_megatron/warmstart.py``): the default recipe starts from the one shipped with the
package."""

from pc_megatron.config import load_config


def test_default_recipe_uses_the_shipped_warm_start():
    """A change to the tiny recipe or the SFT procedure that orphans the shipped warm-start
    would make the default run retrain it (~7 min): re-ship with `pc-megatron warmstart --ship`."""
    from pc_megatron.model.arch import load_arch
    from pc_megatron.run.prepare import initial_policy_dir
    from pc_megatron.warmstart import SHIPPED

    path = initial_policy_dir(load_config("tiny"))
    assert path.parent == SHIPPED and (path / "model.safetensors").is_file()
    assert load_arch(path).hidden_size == 256
    # the RL pool does not change the SFT rows, so both pools start from the shipped warm-start
    assert initial_policy_dir(load_config("tiny", ["data.synthetic.pool=easy"])) == path

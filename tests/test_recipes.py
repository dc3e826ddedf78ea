"""The paper's recipes: each loads and validates, each twin differs from its base in the policy
alone, and `pc-megatron plan` gives figures that can be checked by hand."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pc_megatron.cli import main
from pc_megatron.commands.plan import GIB, model_arch, param_counts, plan
from pc_megatron.config import RECIPE_DIR, load_config
from pc_megatron.errors import ConfigError

RECIPES = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
PAPER = [r for r in RECIPES if r != "tiny"]
# published sizes (billions): Qwen2.5-Math-1.5B 1.54, Qwen3-4B 4.02, Qwen3-8B 8.19, Qwen3-14B 14.77
SIZES = {"deepmath-1.5b": 1.54, "polaris-4b": 4.02, "polaris-8b": 8.19, "polaris-14b": 14.77}


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_loads_and_validates(recipe):
    cfg = load_config(recipe)
    assert cfg.steps > 0


@pytest.mark.parametrize("base", sorted(SIZES))
def test_twins_differ_from_their_base_in_the_policy_alone(base):
    ref = asdict(load_config(base))
    assert ref["scheduler"]["policy"] == "pilot_commit"
    for twin in ("grpo", "dapo"):
        cfg = asdict(load_config(f"{base}-{twin}"))
        assert cfg["scheduler"].pop("policy") == twin
        ref_rest = {**ref, "scheduler": {k: v for k, v in ref["scheduler"].items() if k != "policy"}}
        assert cfg == ref_rest  # same model, data, B, n, learner, engine, evaluation


@pytest.mark.parametrize("recipe", PAPER)
def test_every_paper_recipe_fits_an_h200_by_plan(recipe, capsys):
    assert main(["plan", recipe]) == 0
    assert "fits" in capsys.readouterr().out


@pytest.mark.parametrize(("recipe", "billions"), sorted(SIZES.items()))
def test_parameter_counts_match_the_published_sizes(recipe, billions):
    arch, _ = model_arch(load_config(recipe).model)
    assert param_counts(arch)["total"] / 1e9 == pytest.approx(billions, abs=0.01)


def test_the_14b_plan_by_hand():
    """Qwen3-14B: V = 151,936, h = 5,120, 40 layers, 40 query / 8 KV heads of 128, FFN 17,408,
    untied output layer. Parameters: 2 x 151,936 x 5,120 (embedding, output) + 40 x [5,120 x 5,120
    x 2 (q, o) + 5,120 x 1,024 x 2 (k, v) + 3 x 5,120 x 17,408 (MLP) + 2 x 5,120 + 2 x 128 (norms)]
    + 5,120 = 14,768,307,200. At TP 4 each GPU holds a quarter, 3.69 B: 6.9 GiB of bf16 weights,
    13.8 GiB of fp32 gradients, and 12 B a parameter of optimizer state (41.3 GiB) over DP 4 with the
    distributed optimizer, 10.3 GiB."""
    layer = 5120 * 5120 * 2 + 5120 * 1024 * 2 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128
    total = 2 * 151936 * 5120 + 40 * layer + 5120
    assert total == 14_768_307_200
    res = plan(load_config("polaris-14b"))
    assert res["parameters"] == total and res["params_per_gpu"] == total / 4
    assert res["weights"] == 2 * total / 4 and res["grads"] == 4 * total / 4
    assert res["optimizer"] == 12 * total / 4 / 4 and res["optimizer_without_distopt"] == 12 * total / 4
    assert round(res["weights"] / GIB, 1) == 6.9 and round(res["optimizer"] / GIB, 1) == 10.3


def test_plan_refuses_what_cannot_fit_and_says_what_to_change(capsys):
    overrides = ["learner.tensor_parallel_size=2", "learner.data_parallel_size=2", "rollout.replicas=2"]
    assert main(["plan", "polaris-14b", *overrides]) == 2
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out and "learner.offload_during_rollout=true" in out
    assert main(["plan", "tiny"]) == 2
    assert "the tiny CPU recipe needs no plan" in capsys.readouterr().err


def test_a_cycle_of_inheriting_recipes_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("inherit: b.yaml\n")
    (tmp_path / "b.yaml").write_text("inherit: a.yaml\n")
    with pytest.raises(ConfigError, match="makes a cycle"):
        load_config(str(tmp_path / "a.yaml"))

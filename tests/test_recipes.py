"""The paper's recipes: each loads and validates, each twin differs from its base in the policy alone, each
fits an H200 by `pc-megatron plan`, and each names a model of its published size. (The plan's own
figures: tests/commands/test_plan.py.)"""

from __future__ import annotations

from dataclasses import asdict

import pytest

from pc_megatron.cli import main
from pc_megatron.commands.plan import model_arch, param_counts
from pc_megatron.config import RECIPE_DIR, load_config

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

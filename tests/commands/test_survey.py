"""`pc-megatron survey` (``pc_megatron/commands/survey.py``): the fit of a pool's pass rates, what it
predicts, and the comparison with runs."""

from __future__ import annotations

import json

import pytest

from pc_megatron.commands.survey import format_against, observed
from pc_megatron.config import load_config, to_yaml


def _fake_run(tmp_path, policy: str, rows: list[dict]):
    run = tmp_path / policy
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_config("tiny", [f"scheduler.policy={policy}"])))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_observed_reads_a_runs_first_steps_in_the_surveys_terms(tmp_path):
    rows = [
        {"step": 0, "eval_accuracy": 0.3},
        {"step": 1, "trained_groups": 8, "frac_all_correct": 0.25, "frac_all_wrong": 0.25, "sched/step_generated": 64},
        {"step": 2, "trained_groups": 8, "frac_all_correct": 0.0, "frac_all_wrong": 0.5, "sched/step_generated": 64},
        {"step": 3, "trained_groups": 8, "frac_all_correct": 0.0, "frac_all_wrong": 0.0, "sched/step_generated": 64},
    ]
    got = observed(_fake_run(tmp_path, "grpo", rows), steps=2)
    assert got["steps"] == 2 and got["degenerate_trained"] == 0.5
    assert got["per_informative_group"] == 128 / 8  # 16 groups, 8 of them mixed
    assert got["per_update"] == 64
    res = {
        "recipe": {"n": 8},
        "degenerate": {"8": 0.45},
        "degenerate_interval_at_n": [0.4, 0.5],
        "per_informative_group": {"grpo": 15.0},
        "per_informative_group_interval": {"grpo": [13.0, 17.0]},
    }
    text = format_against(res, [got])
    assert "rollouts per informative group 15.0 (13.0-17.0) vs 16.0" in text
    assert "degenerate n=8 groups 0.45 (0.40-0.50) vs 0.50" in text
    assert "by policy" not in text  # one run per policy: nothing to average


def test_against_several_seeds_gives_each_policys_mean_and_its_ratio_to_grpo(tmp_path):
    def run(name, policy, generated):
        rows = [
            {
                "step": 1,
                "trained_groups": 8,
                "frac_all_correct": 0.0,
                "frac_all_wrong": 0.5,
                "sched/step_generated": generated,
            }
        ]  # 4 informative groups
        d = tmp_path / name
        d.mkdir()
        return observed(_fake_run(d, policy, rows), steps=1)

    runs = [run("g0", "grpo", 40), run("g1", "grpo", 60), run("p0", "pilot_commit", 100), run("p1", "pilot_commit", 60)]
    res = {
        "recipe": {"n": 8},
        "degenerate": {"8": 0.45},
        "degenerate_interval_at_n": [0.4, 0.5],
        "per_informative_group": {"grpo": 12.0, "pilot_commit": 18.0},
        "per_informative_group_interval": {"grpo": [11.0, 13.0], "pilot_commit": [16.0, 20.0]},
        "ratio_to_grpo": {"grpo": 1.0, "pilot_commit": 1.5},
        "ratio_to_grpo_interval": {"grpo": [1.0, 1.0], "pilot_commit": [1.3, 1.7]},
    }
    text = format_against(res, runs)  # a survey saved before rollouts per update were forecast
    assert "grpo          2 runs: 12.5 (10.0-15.0) rollouts per informative group\n" in text
    want = (
        "pilot_commit  2 runs: 20.0 (15.0-25.0) rollouts per informative group; x grpo 1.60 [forecast 1.50 (1.30-1.70)]"
        "; per update x grpo 1.60"
    )
    assert f"  {want}" in text.splitlines()  # the whole line: no forecast per update to print
    res |= {
        "per_update": {"grpo": 64.0, "pilot_commit": 96.0},
        "per_update_ratio_interval": {"pilot_commit": [1.4, 1.6]},
    }
    assert "; per update x grpo 1.60 [forecast 1.50 (1.40-1.60)]" in format_against(res, runs)


def test_survey_of_the_tiny_recipe_then_against_a_run(tmp_path, cache_dir, capsys):
    """The command end to end on the embedded task: sample, fit, simulate, save; then print the saved
    survey beside a run without sampling again."""
    from pc_megatron.cli import main

    out = tmp_path / "sv"
    args = ["survey", "tiny", "--prompts", "24", "--samples", "8", "--steps", "4", "--bootstrap", "2"]
    assert main([*args, "--out", str(out)]) == 0
    first = capsys.readouterr().out
    assert "24 prompts x 8 samples (192 rollouts" in first and "favoured:" in first
    assert "  grpo " in first and "|  512.0   x grpo 1.00" in first  # B x n rollouts per update: 64 x 8
    res = json.loads((out / "survey.json").read_text())
    assert sum(res["histogram"].values()) == pytest.approx(1.0)
    rows = [dict(step=1, trained_groups=4, frac_all_correct=0.5, frac_all_wrong=0.0, **{"sched/step_generated": 32})]
    run = _fake_run(tmp_path, "grpo", rows)
    assert main(["survey", "--load", str(out / "survey.json"), "--against", str(run)]) == 0
    again = capsys.readouterr().out
    assert again.startswith(first.splitlines()[0]) and "vs 16.0; degenerate n=" in again
    assert "cannot tell a pass rate" not in first  # 8 samples for the recipe's n = 8
    # forecast again from the saved per-prompt counts under another setting, without sampling
    assert main(["survey", "--load", str(out / "survey.json"), "tiny", "algo.samples_per_prompt=16", *args[4:]]) == 0
    forecast = capsys.readouterr().out
    assert forecast.startswith(first.splitlines()[0]) and "| 1024.0   x grpo 1.00" in forecast  # B x n: 64 x 16
    res["recipe"]["n"] = 64  # the same survey read for a recipe of n = 64: 8 samples cannot resolve it
    (out / "survey.json").write_text(json.dumps(res))
    assert main(["survey", "--load", str(out / "survey.json")]) == 0
    assert "rerun with --samples 64" in capsys.readouterr().out
    del res["correct"]  # a survey saved before the counts were kept: printed, not forecast again
    (out / "survey.json").write_text(json.dumps(res))
    assert main(["survey", "--load", str(out / "survey.json"), "tiny"]) == 2
    assert "without per-prompt counts" in capsys.readouterr().err

"""Run records (``pc_megatron/run/logs.py``): the summary and its plot's labels, and which columns a
report draws as benchmarks."""

from __future__ import annotations

import json

from pc_megatron.config import load_config
from pc_megatron.run import logs as observability


def test_the_accuracy_plot_is_labelled_with_the_run_policy(tmp_path, monkeypatch):
    rows = [
        {"step": 0, "cum_rollouts": 0, "cum_generated_tokens": 0, "eval_accuracy": 0.4},
        {"step": 1, "cum_rollouts": 32, "cum_generated_tokens": 90, "eval_accuracy": 0.5, "time_step_s": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = []
    monkeypatch.setattr(observability, "plot_accuracy", lambda curves, out, target=None: labels.extend(curves))
    for policy, label in (("pilot_commit", "Pilot-Commit"), ("dapo", "DAPO"), ("grpo", "GRPO")):
        cfg = load_config("tiny", ["steps=1", f"scheduler.policy={policy}"])
        summary = observability.summarize(cfg.steps, cfg.scheduler.policy, tmp_path, wall_s=1.0)
        assert labels[-1] == label and summary["final_eval_accuracy"] == 0.5


def test_the_evaluations_reward_counters_are_not_plotted_as_benchmarks():
    """eval/reward_timeouts and eval/reward_errors share the eval/ prefix of eval.sets' accuracies: the
    report drew them as accuracy curves at zero."""
    from pc_megatron.run.logs import benchmark_keys

    rows = [{"step": 0, "eval/gsm8k": 0.4, "eval/mean": 0.4, "eval/reward_timeouts": 0, "eval/reward_errors": 1}]
    assert benchmark_keys(rows) == ["eval/gsm8k", "eval/mean"]

"""`pc-megatron report` (``pc_megatron/commands/report.py``): one page of plots from the metrics of real runs,
several on the same axes."""

from __future__ import annotations

from pc_megatron.cli import main
from pc_megatron.commands.report import FIGURES
from pc_megatron.config import load_config
from pc_megatron.train import train
from tests.settings import SMALL


def test_report_of_two_policies_side_by_side(cache_dir, tmp_path, capsys):
    for policy in ("grpo", "pilot_commit"):
        train(load_config("tiny", [*SMALL, "steps=2", f"scheduler.policy={policy}"]), tmp_path / "cmp" / policy)
    out = tmp_path / "report"
    runs = [str(tmp_path / "cmp" / p) for p in ("grpo", "pilot_commit")]
    assert main(["report", *runs, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith(("| grpo ", "| pilot_commit "))]
    assert len(rows) == 2 and all("| 2 |" in r for r in rows)  # one row per run, two updates each
    from matplotlib.image import imread

    for name in FIGURES:
        assert f"]({name})" in md
        image = imread(out / name)
        assert image.shape[0] > 200 and image.std() > 0  # a drawn figure, not a blank canvas


def test_report_names_a_folder_that_is_no_run(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_labels_tell_runs_apart(tmp_path):
    from pc_megatron.commands.report import _label

    a, b = tmp_path / "seed0" / "grpo", tmp_path / "seed1" / "grpo"
    assert _label(a, [a, b]) == "seed0/grpo" and _label(b, [a, b]) == "seed1/grpo"


def test_allocation_splits_trained_rollouts_by_whether_their_group_could_teach():
    from pc_megatron.commands.report import _smooth, _trained_degenerate

    rows = [
        {"step": 0, "cum_rollouts": 0},  # the evaluation row: no update
        {"step": 1, "time_step_s": 1.0, "sched/step_trained": 64, "frac_all_correct": 0.25, "frac_all_wrong": 0.5},
        {"step": 2, "time_step_s": 1.0, "sched/step_trained": 32, "frac_all_correct": 0.0, "frac_all_wrong": 0.0},
    ]
    assert _trained_degenerate(rows) == 48  # 3/4 of step 1's groups had one reward for all
    assert _smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]

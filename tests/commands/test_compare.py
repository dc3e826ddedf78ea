"""`pc-megatron compare` (``pc_megatron/commands/compare.py``): bad arguments refused before anything runs;
every method at every seed, with intervals, finished runs reused."""

import pytest

from pc_megatron.run.logs import read_metrics
from tests.settings import SMALL


def test_compare_refuses_a_fraction_outside_0_1_before_running_anything(tmp_path, capsys):
    from pc_megatron.cli import main

    out = tmp_path / "cmp"
    assert main(["compare", "tiny", "--methods", "grpo", "adaptive", "--out", str(out), "--fraction", "1.5"]) == 2
    assert "--fraction 1.5" in capsys.readouterr().err
    assert not out.exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method-overrides", "dapo", "steps=4"], "not among --methods"),
        (["--method-overrides", "adaptive", "stepz=4"], "stepz"),
    ],
    ids=["method-not-compared", "bad-key"],
)
def test_compare_refuses_bad_method_overrides_before_running_anything(tmp_path, capsys, extra, message):
    from pc_megatron.cli import main

    out = tmp_path / "cmp"
    assert main(["compare", "tiny", "--methods", "grpo", "adaptive", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture(scope="module")
def prepared_cache(cache_dir):
    """The session cache as one run of the compared recipe leaves it: the tiny model, its task and its
    warm-start. compare starts its runs two at a time, and two runs preparing a cold cache at once
    write the same cache folders (one run saw the other's half-written config.json); in its first
    file (test_train_integration.py) this test always ran after a single run had prepared them."""
    from pc_megatron.config import load_config
    from pc_megatron.run.prepare import prepare_run

    prepare_run(load_config("tiny", [*SMALL, "data.synthetic.num_eval_expected=200"]), progress=False)
    return cache_dir


@pytest.mark.usefixtures("prepared_cache")
def test_compare_runs_every_method_at_every_seed_and_reports_intervals(cache_dir, tmp_path):
    from pc_megatron.commands.compare import compare

    over = [*SMALL, "steps=2", "scheduler.p_lower=0.0", "data.synthetic.num_eval_expected=200"]
    dead = tmp_path / "cmp" / "seed1" / "pilot_commit"  # a run killed while writing its first checkpoint
    (dead / "checkpoints" / "step_000002.tmp").mkdir(parents=True)  # (train refuses a folder with checkpoints/)
    (dead / "config.yaml").write_text("seed: 1\n")
    own = {"pilot_commit": ["steps=3"]}  # one method's own overrides reach its runs only
    result = compare(
        "tiny", over, tmp_path / "cmp", ("grpo", "pilot_commit"), seeds=(0, 1), jobs=2, method_overrides=own
    )
    assert result["metric"] == "eval_expected_accuracy" and result["seeds"] == [0, 1]
    for s in (0, 1):
        assert read_metrics(tmp_path / "cmp" / f"seed{s}" / "grpo")[-1]["step"] == 2
        assert read_metrics(tmp_path / "cmp" / f"seed{s}" / "pilot_commit")[-1]["step"] == 3
    # the dead run was moved aside (kept, not deleted) and run again from the start
    assert [(p / "config.yaml").read_text() for p in dead.parent.glob("pilot_commit.failed-*")] == ["seed: 1\n"]
    grpo = result["methods"]["grpo"]
    seed_mean_best = max(
        sum(r["eval_expected_accuracy"] for r in rs) / 2
        for rs in zip(*(read_metrics(tmp_path / "cmp" / f"seed{s}" / "grpo") for s in (0, 1)), strict=True)
        if "eval_expected_accuracy" in rs[0]
    )
    assert result["target"] == pytest.approx(seed_mean_best)
    assert grpo["rollouts_to_target"]["reached"] in ("1/2", "2/2")  # the mean curve's best: some seed reaches it
    for m in result["methods"].values():
        assert m["auc"]["n"] == 2 and m["auc"]["ci95"][0] <= m["auc"]["mean"] <= m["auc"]["ci95"][1]
        assert set(m["per_seed"]) == {0, 1}
    assert "pilot_commit_vs_grpo" in result and "grpo_vs_pilot_commit" not in result
    pc = result["paired"]["methods"]["pilot_commit"]  # paired by seed at equal rollouts
    assert set(result["paired"]["methods"]) == {"pilot_commit"} and pc["auc_gain"]["n"] == 2
    for name in ("compare.json", "compare.md", "compare.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 100
    # finished runs are reused, not redone
    mtime = (tmp_path / "cmp" / "seed0" / "grpo" / "metrics.jsonl").stat().st_mtime
    again = compare(
        "tiny", over, tmp_path / "cmp", ("grpo", "pilot_commit"), seeds=(0, 1), jobs=2, method_overrides=own
    )
    assert again["target"] == result["target"]
    assert (tmp_path / "cmp" / "seed0" / "grpo" / "metrics.jsonl").stat().st_mtime == mtime

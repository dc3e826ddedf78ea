"""`pc-megatron profile` (``pc_megatron/commands/profile.py``): a trace with every phase by name, a breakdown
that adds up to the step."""

from __future__ import annotations

import json

from pc_megatron import phases
from pc_megatron.cli import main
from tests.settings import SMALL

PHASES = {"scheduler", "engine_wait", "rollout", "reward", "engine_sleep", "logprob", "train", "optimizer", "sync"}


def test_profile_writes_a_trace_with_every_phase_and_a_breakdown_that_adds_up(cache_dir, tmp_path, capsys):
    out = tmp_path / "prof"
    assert main(["profile", "tiny", *SMALL, "--steps", "3", "--warmup", "1", "--out", str(out)]) == 0
    events = [e for e in json.loads((out / "trace.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    names = [e["name"] for e in events]
    for phase in PHASES | {"forward_backward"}:
        assert names.count(phase) == 3, (phase, names.count(phase))  # once per profiled step
    assert {f"step {s}" for s in (2, 3, 4)} <= set(names) and "step 1" not in names  # warm-up left out
    res = json.loads((out / "breakdown.json").read_text())
    assert res["steps"] == [2, 3, 4] and set(res["phases"]) == PHASES
    assert abs(res["phase_sum_over_step"] - 1.0) < 0.05
    # the trace and the metrics saw the same steps: the rollout ranges last what the rollout phase took
    measured = sum(res["phases"]["rollout"])
    assert abs(res["trace_phase_s"]["rollout"] - measured) < 0.1 * measured
    md = (out / "breakdown.md").read_text()
    assert all(f"| {p} |" in md for p in PHASES) and "`aten::mm`" in md
    from matplotlib.image import imread

    image = imread(out / "breakdown.png")
    assert image.shape[0] > 200 and image.std() > 0
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and not any("eval_accuracy" in r for r in rows)
    assert not (out / "run" / "checkpoints").exists()
    # and the ranges are off again: a later run in this process records nothing
    assert not phases.enabled() and phases.phase_range("rollout") is phases._NULL
    assert "phases = " in capsys.readouterr().out


def test_profile_refuses_bad_arguments_before_running(tmp_path, capsys):
    assert main(["profile", "tiny", "--steps", "0", "--out", str(tmp_path / "p")]) == 2
    assert "--steps >= 1" in capsys.readouterr().err
    (tmp_path / "q" / "run").mkdir(parents=True)
    (tmp_path / "q" / "run" / "metrics.jsonl").write_text("")
    assert main(["profile", "tiny", "--out", str(tmp_path / "q")]) == 2
    assert "already holds a profile" in capsys.readouterr().err

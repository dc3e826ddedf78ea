"""Scoring a file of completions (``pc_megatron/rewards/offline.py``, the `pc-megatron score` command)."""

from __future__ import annotations

import pytest


def test_score_command_scores_a_file_and_marks_what_failed(tmp_path, capsys):
    import json

    from pc_megatron.cli import main

    rows = [
        {"id": 1, "completion": "so $\\boxed{\\frac{1}{2}}$", "answer": "0.5"},
        {"id": 2, "completion": "I think it is 3", "answer": "3"},
        {"id": 3, "completion": "\\boxed{9^{9^{9^{9}}}}", "answer": "3"},
    ]
    src, out = tmp_path / "c.jsonl", tmp_path / "scored.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", str(src), "--reward", "math_verify", "--timeout-s", "2", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == 3 and summary["timeouts"] == 1 and summary["accuracy"] == pytest.approx(1 / 3)
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in back] == [1, 2, 3] and [r["correct"] for r in back] == [True, False, False]
    assert [r.get("failed") for r in back] == [None, None, "timeout"]
    src.write_text('{"id": 1, "completion": "x"}\n')
    assert main(["score", str(src)]) == 2
    assert "c.jsonl:1: every row needs ['id', 'completion', 'answer']" in capsys.readouterr().err

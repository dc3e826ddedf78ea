"""Faults and bad input, round two: a cluster that does not answer, resumes that would rewrite the record,
and the smaller checks that must come before any process starts. (SIGTERM mid-run: tests/test_train.py;
a checkpoint writer that outlives a killed run: tests/compat/test_checkpoint_writer.py; a damaged state
file: tests/checkpoint/test_checkpoint.py.)"""

import json
import time

import pytest

from pc_megatron.cli import main
from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from tests.settings import SMALL


def test_an_unreachable_cluster_is_one_clear_error_before_any_run_folder(tmp_path, capsys):
    t0 = time.time()
    rc = main(
        ["train", "tiny", "runtime=ray", "ray.address=127.0.0.1:1", "ray.connect_timeout_s=5", f"out_dir={tmp_path}"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and time.time() - t0 < 30
    assert "no Ray cluster answers at 127.0.0.1:1" in err and "ray start --head --port=1" in err
    assert list(tmp_path.iterdir()) == []  # nothing was started, no run folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("resume")
    assert main(["train", "tiny", *SMALL, "steps=2", f"out_dir={out}", "name=run"]) == 0
    return out / "run"


def test_resume_refuses_a_change_the_record_cannot_hold(finished_run, capsys):
    before = (finished_run / "config.yaml").read_text()
    assert main(["train", "--resume", str(finished_run), "algo.samples_per_prompt=16", "steps=3"]) == 2
    err = capsys.readouterr().err
    assert "--resume cannot change algo.samples_per_prompt" in err and "algo.samples_per_prompt=4" in err
    assert (finished_run / "config.yaml").read_text() == before


def test_a_config_yaml_edited_by_hand_is_refused_on_resume_naming_the_key(finished_run, capsys):
    """config.yaml is what --resume compares overrides against; the checkpoint's own record of the
    fixed keys catches an edit of the file itself."""
    saved = finished_run / "config.yaml"
    before = saved.read_text()
    assert "\nseed: 0\n" in before  # under the first line, which says what auto became
    try:
        saved.write_text(before.replace("seed: 0", "seed: 5", 1))
        assert main(["train", "--resume", str(finished_run), "steps=3"]) == 2
        err = capsys.readouterr().err
        assert "would continue on other inputs than the steps already taken" in err and "seed: 0 -> 5" in err
        assert saved.read_text() == before.replace("seed: 0", "seed: 5", 1)  # refused before a file changed
        assert not (finished_run / "checkpoints" / "step_000003").exists()
    finally:
        saved.write_text(before)


def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_run, capsys):
    files = {p: p.read_bytes() for p in finished_run.glob("*.json*")}
    assert main(["train", "--resume", str(finished_run)]) == 0
    assert "the run is complete (step 2 of 2)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in finished_run.glob("*.json*")} == files


def test_a_safe_change_on_resume_is_logged_with_its_step(finished_run):
    assert main(["train", "--resume", str(finished_run), "steps=3"]) == 0
    log = [json.loads(line) for line in (finished_run / "resumes.jsonl").read_text().splitlines()]
    assert log == [{"after_step": 2, "changes": {"steps": {"was": 2, "now": 3}}}]
    assert "steps: 3" in (finished_run / "config.yaml").read_text()


def test_the_smaller_checks_come_first_and_say_what_is_wrong(tmp_path, tiny_model_dir, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\nlearner:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+:\d+: not valid YAML"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="data.train_path=nowhere.jsonl: no such file"):
        load_config("tiny", ["data.train_path=nowhere.jsonl"])
    # a run folder without a checkpoint yet
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 1\n")
    assert main(["convert", "--to", "hf", str(run), str(tmp_path / "out")]) == 2
    assert "has no checkpoint yet" in capsys.readouterr().err
    # TP 3 does not divide the tiny model's heads: the reason, before "needs runtime=ray" or any process
    assert main(["train", "tiny", "learner.tensor_parallel_size=3", f"out_dir={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert "divide" in err and "runtime=ray" not in err and not (tmp_path / "runs").exists()
    # the same under runtime=ray: found from config.json, before Ray starts
    t0 = time.time()
    assert main(["train", "tiny", "runtime=ray", "learner.tensor_parallel_size=3", f"out_dir={tmp_path / 'r2'}"]) == 2
    assert time.time() - t0 < 10 and not (tmp_path / "r2").exists()

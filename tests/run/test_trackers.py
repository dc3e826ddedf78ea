"""The experiment trackers (``loggers``), against the real ones: a W&B run in offline mode, an MLflow
tracking server on SQLite (started for the session), MLflow's file store. What a user relies on: every
row and every evaluation's samples reach each tracker at their steps; a resumed run continues the same
tracker run without a repeated step; a missing package or an unreachable server is one line before the
run; a tracker that fails or hangs mid-run never stops training and is counted.

The whole loop with trackers (a SIGKILL and a resume): ``tests/test_train.py``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError
from pc_megatron.run import trackers as trackers_module
from pc_megatron.run.trackers import Trackers, check_trackers
from tests.trackers import free_port, mlflow_history, mlflow_latest, mlflow_runs, wandb_history

ROWS = [{"step": s, "cum_rollouts": 32 * s, "reward_mean": 0.1 * s, "eval/mean": 0.5, "note": "x"} for s in range(5)]
SAMPLES = [
    {"set": "heldout", "prompt": "1+1=", "completion": "2 | 3\nok", "answer": "2", "reward": 1.0, "correct": True}
]
PARAMS = {"seed": 0, "algo.lr": 1e-6, "loggers": ["wandb", "mlflow"], "name": ""}


def test_loggers_name_known_trackers_once():
    with pytest.raises(ConfigError, match=r"loggers: 'neptune' is not one of tensorboard, wandb, mlflow"):
        load_config("tiny", ["loggers=[tensorboard,neptune]"])
    with pytest.raises(ConfigError, match="names a tracker twice"):
        load_config("tiny", ["loggers=[mlflow,mlflow]"])
    assert load_config("tiny").loggers == ["tensorboard"]


def test_a_missing_tracker_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed: import fails
    with pytest.raises(ConfigError) as e:
        check_trackers(["tensorboard", "wandb"])
    assert str(e.value) == (
        "loggers: wandb needs the wandb package, which is not installed: pip install 'pc-megatron[trackers]' "
        "(or drop wandb from loggers)"
    )


def test_an_unreachable_tracker_server_is_one_line_before_the_run_starts(monkeypatch, tmp_path, cache_dir, capsys):
    pytest.importorskip("mlflow")
    from pc_megatron.cli import main

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    with pytest.raises(ConfigError, match=rf"mlflow: the tracking server MLFLOW_TRACKING_URI={dead} does not answer"):
        check_trackers(["mlflow"])
    assert main(["train", "tiny", "loggers=[mlflow]", f"out_dir={tmp_path}", "name=run", "progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not answer" in err[0] and "unset MLFLOW_TRACKING_URI" in err[0]
    assert not (tmp_path / "run").exists()  # nothing started, nothing written

    monkeypatch.delenv("WANDB_MODE", raising=False)  # W&B logs online unless told otherwise
    monkeypatch.setenv("WANDB_BASE_URL", dead)
    with pytest.raises(ConfigError, match="set WANDB_MODE=offline"):
        check_trackers(["wandb"])
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(["wandb"])  # offline needs no server


def test_wandb_and_mlflow_hold_every_row_and_samples_and_a_resume_continues_the_same_runs(
    monkeypatch, tmp_path, mlflow_tracking
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_tracking.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "unit")
    run_dir = tmp_path / "run-a"
    run_dir.mkdir()
    t = Trackers(["wandb", "mlflow"], run_dir, PARAMS, resume_step=-1)
    for row in ROWS[:4]:
        if row["step"] == 3:
            t.samples(3, SAMPLES)  # an evaluation's samples come before its step's metric row, as in a run
        t.log(row)
    t.flush()
    t.close("KILLED")
    state = json.loads((run_dir / "trackers.json").read_text())
    assert state["wandb"]["last_step"] == state["mlflow"]["last_step"] == 3

    # a resume from the checkpoint at step 1: steps 2 and 3 are redone, and come out otherwise (at η >= 1 or
    # on a GPU): MLflow logs them again and the latest value is the run's; W&B offline keeps its first copies
    redone = [{**row, "reward_mean": row["reward_mean"] + 1.0} for row in ROWS[2:]]
    t = Trackers(["wandb", "mlflow"], run_dir, {**PARAMS, "steps": 5}, resume_step=1)
    for row in redone:
        t.log(row)
    t.flush()
    t.close("FINISHED")
    assert t.failures == {}

    (run,) = mlflow_runs(mlflow_tracking.uri, "unit")
    assert (
        run.info.run_name == "run-a" and run.info.status == "FINISHED" and run.info.run_id == state["mlflow"]["run_id"]
    )
    assert run.data.params["algo.lr"] == "1e-06" and run.data.params["loggers"] == "['wandb', 'mlflow']"
    assert run.data.params["steps"] == "5"  # a key a resume added
    history = mlflow_history(mlflow_tracking.uri, run.info.run_id)
    assert set(history) == {"cum_rollouts", "reward_mean", "eval/mean"}  # numbers only; not the step itself
    latest = mlflow_latest(mlflow_tracking.uri, run.info.run_id)
    assert latest["reward_mean"] == [(r["step"], pytest.approx(r["reward_mean"])) for r in ROWS[:2] + redone]
    assert latest["cum_rollouts"] == [(s, 32.0 * s) for s in range(5)]
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_tracking.uri)
    local = client.download_artifacts(run.info.run_id, "eval_samples/step_000003.json", str(tmp_path))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == list(SAMPLES[0]) and table["data"][0][3] == "2"

    ids, rows = wandb_history(run_dir / "wandb")
    assert ids == {state["wandb"]["id"]}  # two offline sessions of one W&B run
    assert [r["_step"] for r in rows] == [0, 1, 2, 3, 4]
    firsts = [r["reward_mean"] for r in ROWS[:4]] + [redone[-1]["reward_mean"]]  # offline: a step's first copy
    assert [r["reward_mean"] for r in rows] == pytest.approx(firsts)
    assert [r["cum_rollouts"] for r in rows] == [32 * s for s in range(5)] and rows[3][
        "eval_samples/_type"
    ] == "table-file"


def test_a_tracker_that_fails_mid_run_is_counted_and_the_rows_go_on(monkeypatch, tmp_path, capsys):
    """MLflow's file store, broken under the run after two rows (its metrics folder replaced by a file):
    every later row fails in the tracker; none raises into the loop; the failures are counted."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t = Trackers(["tensorboard", "mlflow"], run_dir, PARAMS, resume_step=-1)
    for row in ROWS[:2]:
        t.log(row)
    t.flush()
    (metrics_dir,) = (tmp_path / "mlruns").glob("*/*/metrics")
    shutil.rmtree(metrics_dir)
    metrics_dir.write_text("not a folder")
    for row in ROWS[2:]:
        t.log(row)
    t.flush()
    t.close("FINISHED")
    assert t.failures == {"mlflow": 4}  # the three rows, and ending the run
    warning = capsys.readouterr().err
    assert warning.count("warning: tracker mlflow: log at step 2 failed") == 1 and "training goes on" in warning
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["last_step"] == 1


def test_a_hung_tracker_server_never_holds_a_step(monkeypatch, tmp_path, mlflow_tracking):
    """The server frozen (SIGSTOP) mid-run: logging returns at once, a checkpoint's flush gives up after its
    bound and counts the tracker as failed; thawed, the rows it held arrive."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_tracking.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hung")
    monkeypatch.setattr(trackers_module, "FLUSH_TIMEOUT_S", 2.0)
    t = Trackers(["mlflow"], tmp_path, PARAMS, resume_step=-1)
    os.killpg(mlflow_tracking.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for row in ROWS:
            t.log(row)
        assert time.monotonic() - t0 < 0.5
        t.flush()
        assert 2.0 <= time.monotonic() - t0 < 10 and t.failures == {"mlflow": 1}
        t1 = time.monotonic()
        t.flush()  # the next checkpoint: a tracker known to be behind is not waited for again
        assert time.monotonic() - t1 < 0.5
    finally:
        os.killpg(mlflow_tracking.proc.pid, signal.SIGCONT)
    monkeypatch.setattr(trackers_module, "FLUSH_TIMEOUT_S", 60.0)
    t.close("FINISHED")
    (run,) = mlflow_runs(mlflow_tracking.uri, "hung")
    assert mlflow_history(mlflow_tracking.uri, run.info.run_id)["cum_rollouts"] == [(s, 32.0 * s) for s in range(5)]


class _HalfAlive:
    """An MLflow server that answers its health check and never its API (a stuck database behind it)."""

    def __init__(self) -> None:
        import http.server
        import threading

        release = self.release = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.rstrip("/").endswith("/health"):
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"OK")
                    return
                release.wait(120)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.uri = f"http://user:s3cret@127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


def test_a_half_alive_tracking_server_stops_the_start_within_its_deadline(monkeypatch, tmp_path):
    """Its health check answers, its API hangs: the start gives up after START_TIMEOUT_S in one line (it
    held the start, and the run folder's lock, for MLflow's retries: ~20 minutes), and the credentials
    in the address are shown nowhere."""
    server = _HalfAlive()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setattr(trackers_module, "START_TIMEOUT_S", 2.0)
    try:
        check_trackers(["mlflow"])  # the health check passes
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="mlflow did not start its run within 2 s") as e:
            Trackers(["mlflow"], tmp_path, PARAMS, -1)
        assert time.monotonic() - t0 < 10 and "s3cret" not in str(e.value)
    finally:
        server.close()


def test_credentials_in_a_tracker_address_are_redacted_from_messages(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:hunter2@127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match=r"http://\*\*\*@127.0.0.1") as e:
        check_trackers(["mlflow"])
    assert "hunter2" not in str(e.value) and "alice" not in str(e.value)


def test_after_a_resume_mlflows_file_store_holds_the_redone_steps_values(monkeypatch, tmp_path):
    """The same as on a server, in MLflow's file store: at every step the latest value is the resumed
    run's (metrics.jsonl's), the steps before the checkpoint as first logged."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # deprecated in MLflow 3, still what many use
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "filestore")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t = Trackers(["mlflow"], run_dir, PARAMS, resume_step=-1)
    for row in ROWS[:4]:
        t.log(row)
    t.flush()
    t.close("KILLED")
    redone = [{**row, "reward_mean": row["reward_mean"] - 5.0} for row in ROWS[2:]]
    t = Trackers(["mlflow"], run_dir, PARAMS, resume_step=1)
    for row in redone:
        t.log(row)
    t.close("FINISHED")
    uri = (tmp_path / "mlruns").as_uri()
    (run,) = mlflow_runs(uri, "filestore")
    latest = mlflow_latest(uri, run.info.run_id)
    assert latest["reward_mean"] == [(r["step"], pytest.approx(r["reward_mean"])) for r in ROWS[:2] + redone]

"""The trackers end to end, as a user runs them: ``pc-megatron train tiny steps=6`` with
``loggers=[tensorboard,wandb,mlflow]`` (W&B offline, a local MLflow server on SQLite), killed (SIGKILL)
after its step-4 checkpoint and resumed; then what each tracker holds against ``metrics.jsonl``.

    python tools/check_trackers.py runs/trackers [extra overrides]   # ~2-3 minutes on 2 cores

Needs the trackers extra (``pip install -e '.[trackers]'``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pc_megatron.config import leaf_values, read_run_config
from pc_megatron.run.logs import read_metrics
from tests.settings import comparable
from tests.trackers import mlflow_history, mlflow_runs, mlflow_server, numbers, tracked, wandb_history


def main(out: Path, overrides: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=False)
    (out / "mlflow").mkdir()
    run_dir = out / "run"
    with mlflow_server(out / "mlflow") as (uri, _):
        env = {**os.environ, "WANDB_MODE": "offline", "MLFLOW_TRACKING_URI": uri}
        env.pop("WANDB_SERVICE", None)
        cli = [sys.executable, "-m", "pc_megatron.cli", "train"]
        args = ["tiny", "steps=6", "checkpoint.every_steps=2", "loggers=[tensorboard,wandb,mlflow]", *overrides]
        t0 = time.time()
        with open(out / "first.log", "w") as log:
            p = subprocess.Popen(
                [*cli, *args, f"out_dir={out}", "name=run"], env=env, stdout=log, stderr=log, start_new_session=True
            )
            latest = run_dir / "checkpoints" / "latest"
            while not (latest.exists() and latest.read_text() >= "step_000004"):
                if p.poll() is not None:
                    raise SystemExit(f"the run ended before the kill: {out / 'first.log'}")
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        print(
            f"killed at {time.time() - t0:.0f} s, metrics.jsonl at steps {[r['step'] for r in read_metrics(run_dir)]}"
        )
        with open(out / "resume.log", "w") as log:
            if subprocess.run([*cli, "--resume", str(run_dir)], env=env, stdout=log, stderr=log).returncode:
                raise SystemExit(f"the resume failed: {out / 'resume.log'}")
        rows = read_metrics(run_dir)
        want = {k: [s for s, _ in v] for k, v in tracked(rows).items()}
        runs = mlflow_runs(uri)
        history = mlflow_history(uri, runs[0].info.run_id)
        checks = {
            "mlflow: one run, FINISHED": len(runs) == 1 and runs[0].info.status == "FINISHED",
            "mlflow: every metric at metrics.jsonl's steps, each once": {
                k: [s for s, _ in v] for k, v in history.items()
            }
            == want,
            "mlflow: the values of metrics.jsonl (wall-clock figures aside)": all(
                dict(history[k])[r["step"]] == v for r in rows for k, v in numbers(comparable(r)).items()
            ),
            "mlflow: the config as parameters (and what its auto settings became)": {
                k: v for k, v in runs[0].data.params.items() if not k.startswith("resolved.")
            }
            == {k: str(v) for k, v in leaf_values(read_run_config(run_dir / "config.yaml")).items()},
        }
        ids, wandb_rows = wandb_history(run_dir / "wandb")
        sessions = len(list((run_dir / "wandb").glob("offline-run-*")))
        checks |= {
            f"wandb: one run id in {sessions} offline sessions": len(ids) == 1,
            "wandb: each step once": [w["_step"] for w in wandb_rows] == [r["step"] for r in rows],
            "wandb: the values of metrics.jsonl (wall-clock figures aside)": all(
                w[k] == v for r, w in zip(rows, wandb_rows, strict=False) for k, v in numbers(comparable(r)).items()
            ),
        }
    summary = json.loads((run_dir / "summary.json").read_text())
    print(
        f"{len(rows)} rows, {len(want)} metrics, {len(runs[0].data.params)} parameters, "
        f"tracker failures {summary['tracker_failures']}"
    )
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    raise SystemExit(main(Path(sys.argv[1]), sys.argv[2:]))

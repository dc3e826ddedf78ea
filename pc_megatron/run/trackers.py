"""Experiment trackers (``loggers``): every metric row of ``metrics.jsonl`` and the sample generations of
each evaluation also go to TensorBoard, Weights & Biases or MLflow.

- **Settings.** W&B and MLflow read their own environment variables (``WANDB_MODE``, ``WANDB_PROJECT``,
  ``WANDB_ENTITY``, ``WANDB_DIR``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...). The run's
  name is the run directory's; its parameters are the resolved config.
- **Checked first.** A tracker whose package is missing or whose server does not answer is one line
  before anything starts (``check_trackers``).
- **Never in the way.** W&B and MLflow are written from a thread of their own, so a slow or dead server
  never holds a step. A call that fails is counted, warned about once, and the run goes on; the counts
  end in ``summary.json`` (``tracker_failures``). Before each checkpoint the rows so far are kept by
  each tracker (or counted as failed), so a resume never misses a step.
- **Resume.** ``trackers.json`` in the run directory holds each tracker's run id and the last step it
  kept. A resumed run continues the same tracker run and skips the steps the tracker already has: those
  after the checkpoint are redone identically (the run resumes exactly) save their wall-clock figures,
  and the tracker keeps the first. TensorBoard instead drops them (``purge_step``) and takes them again.
  MLflow has a row once its call returns; W&B once it has written it (``WandB``): after a kill, the
  steps since the last checkpoint that W&B had not yet written are sent again.
"""

from __future__ import annotations

import base64
import math
import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pc_megatron.errors import ConfigError
from pc_megatron.run.state import save_tracker_ids, tracker_ids

PACKAGE = {"wandb": "wandb", "mlflow": "mlflow"}
INSTALL = "pip install 'pc-megatron[trackers]'"
FLUSH_TIMEOUT_S = 60.0  # how long a checkpoint or the end of the run waits for a tracker to take its rows
REACH_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0  # how long a tracker may take to start (or resume) its run


def redact(text: str) -> str:
    """``text`` with the credentials of any URL in it (``scheme://user:password@host``) replaced by ``***``:
    MLFLOW_TRACKING_URI and WANDB_BASE_URL may carry them, and messages go to logs."""
    return re.sub(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@", r"\1***@", text)


def start_within(name: str, make: Callable[[], Any], timeout_s: float) -> Any:
    """``make()`` (a tracker starting or resuming its run) on a thread of its own, given up after
    ``timeout_s``: a server that answers its health check but not its API would hold the start (and the
    run folder's lock) for its client's retries, ~20 minutes for MLflow's."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["made"] = make()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=go, name=f"pcm-start-{name}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ConfigError(
            f"loggers: {name} did not start its run within {timeout_s:g} s (its server answers but its API does "
            f"not?): fix the server, or drop {name} from loggers"
        )
    if "error" in box:
        raise box["error"]
    return box["made"]


def check_trackers(loggers: list[str]) -> None:
    """What can fail before a run starts: each tracker's package, and the server it would log to."""
    for name in loggers:
        if name in PACKAGE:
            try:
                __import__(PACKAGE[name])
            except ImportError:
                raise ConfigError(
                    f"loggers: {name} needs the {PACKAGE[name]} package, which is not installed: {INSTALL} "
                    f"(or drop {name} from loggers)"
                ) from None
    if "mlflow" in loggers:
        _check_mlflow_server()
    if "wandb" in loggers:
        _check_wandb_server()


def _check_mlflow_server() -> None:
    import mlflow

    uri = mlflow.get_tracking_uri()
    if urllib.parse.urlparse(uri).scheme not in ("http", "https"):
        return  # a local store (a folder, a SQLite file): created on first use
    parts = urllib.parse.urlparse(uri)
    request = urllib.request.Request(
        parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl().rstrip("/") + "/health"
    )
    if parts.username:  # credentials in the address: sent as basic auth, as MLflow's client does
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=REACH_TIMEOUT_S) as r:
            r.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            redact(
                f"loggers: mlflow: the tracking server MLFLOW_TRACKING_URI={uri} does not answer ({reason}): start "
                "it, fix the address, or unset MLFLOW_TRACKING_URI to log to a local store"
            )
        ) from None


def _check_wandb_server() -> None:
    mode = os.environ.get("WANDB_MODE", "online")
    if mode in ("offline", "dryrun", "disabled"):
        return
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
    url = urllib.parse.urlparse(base)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(
            redact(
                f"loggers: wandb logs online (WANDB_MODE={mode}) but {base} cannot be reached ({e}): set "
                "WANDB_MODE=offline to log to the run directory and `wandb sync` it later, or fix the network"
            )
        ) from None


def _scalars(row: dict) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoard:
    name = "tensorboard"
    durable = True

    def __init__(self, run_dir: Path, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # the steps after the checkpoint are redone: TensorBoard drops its copies and takes them again
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def log(self, row: dict) -> None:
        for k, v in _scalars(row).items():
            self.writer.add_scalar(k, v, row["step"])

    def samples(self, step: int, rows: list[dict]) -> None:
        cols = list(rows[0])
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(r[c]) for c in cols) + " |" for r in rows]
        self.writer.add_text("eval_samples", "\n".join(lines), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def _cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", "<br>")


class WandB:
    """A W&B run. W&B writes behind: its own process keeps rows in memory and writes them every
    ``WRITE_BEHIND_S`` (W&B's default is 15 s). So a row is only counted as kept (``durable``) once a
    checkpoint's ``flush`` has waited out that interval; a row W&B loses to a kill between two
    checkpoints is sent again after the resume. The steps a resume redoes are sent again only where the
    run can be rewound (``resume_from``, online); offline W&B keeps the first copy of a step it has."""

    name = "wandb"
    durable = False  # a row W&B took is kept only after its next write (``flush``)
    WRITE_BEHIND_S = 1.0

    def __init__(self, run_dir: Path, params: dict, state: dict, resume_step: int = -1) -> None:
        import wandb

        self.wandb = wandb
        kw: dict[str, Any] = {"id": state.setdefault("id", secrets.token_hex(16)), "resume": "allow"}
        self.redoes = False  # W&B keeps the first copy of a step it has, unless the run is rewound
        if "last_step" not in state:
            kw["resume"] = "never"  # a fresh run: an id that exists already is an error, not a merge
        elif 0 <= resume_step < state["last_step"] and os.environ.get("WANDB_MODE", "online") == "online":
            # the steps after the checkpoint are redone: rewind the W&B run to there (a server feature)
            kw = {"resume_from": f"{state['id']}?_step={resume_step + 1}"}
            self.redoes = True
        self.run = wandb.init(
            **kw,
            name=run_dir.name,
            project=None if os.environ.get("WANDB_PROJECT") else "pc-megatron",
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
            config=params,
            allow_val_change=True,  # a resume may change a few keys (steps, checkpoint.*)
            settings=wandb.Settings(x_transaction_log_flush_interval=self.WRITE_BEHIND_S),
        )

    def log(self, row: dict) -> None:
        # commit: the step is complete (else W&B holds the last step open until a later one arrives)
        self.run.log(_scalars(row), step=row["step"], commit=True)

    def samples(self, step: int, rows: list[dict]) -> None:
        cols = list(rows[0])
        table = self.wandb.Table(columns=cols, data=[[_plain(r[c]) for c in cols] for r in rows])
        self.run.log({"eval_samples": table}, step=step, commit=False)  # with the step's metric row

    def flush(self) -> None:
        time.sleep(1.5 * self.WRITE_BEHIND_S)  # W&B's process writes what it holds every WRITE_BEHIND_S

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, bool)) or v is None else str(v)


class MLflow:
    """An MLflow run, through ``MlflowClient``: each call returns once the store (a server, a database, a
    folder) holds it."""

    name = "mlflow"
    durable = True
    MAX_PARAM = 6000  # MLflow's limit on a parameter's value

    redoes = True  # a metric's history keeps every value: a redone step's value is logged again, the latest

    def __init__(self, run_dir: Path, params: dict, state: dict, resume_step: int = -1) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = client = MlflowClient()
        self.key = _file_store_key if urllib.parse.urlparse(client.tracking_uri).scheme in ("", "file") else str
        if "run_id" in state:
            run = client.get_run(state["run_id"])
            client.update_run(state["run_id"], status="RUNNING")
            have = run.data.params  # a parameter is written once: a resume adds only new keys
        else:
            exp_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "pc-megatron")
            exp = client.get_experiment_by_name(exp_name)
            exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID") or (
                exp.experiment_id if exp else client.create_experiment(exp_name)
            )
            run = client.create_run(exp_id, run_name=run_dir.name, tags={"pc_megatron.run_dir": str(run_dir)})
            state["run_id"], have = run.info.run_id, {}
        self.run_id = state["run_id"]
        todo = [Param(k, str(v)[: self.MAX_PARAM]) for k, v in params.items() if k not in have]
        for i in range(0, len(todo), 100):  # MLflow takes at most 100 parameters a call
            client.log_batch(self.run_id, params=todo[i : i + 100])

    def log(self, row: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(self.key(k), v, now, row["step"]) for k, v in _scalars(row).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def samples(self, step: int, rows: list[dict]) -> None:
        data = {c: [_plain(r[c]) for r in rows] for c in rows[0]}
        self.client.log_table(self.run_id, data=data, artifact_file=f"eval_samples/step_{step:06d}.json")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=status)


def _file_store_key(key: str) -> str:
    """A metric's name in MLflow's file store, which keeps each metric in a file named by its key: a key
    cannot also be a folder there (``eval_accuracy`` beside ``eval_accuracy/add1``), so ``/`` becomes ``.``."""
    return key.replace("/", ".")


class _Background:
    """One tracker's calls, in order, on a thread of its own: the training loop never waits on a server.
    ``done(step)`` is called after each row the tracker took; a call that raises is counted."""

    def __init__(self, tracker, done: Callable[[str, int], None], failed: Callable[[str, str, Exception], None]):
        self.tracker, self.done, self.failed = tracker, done, failed
        self.taken = -1  # the last step the tracker took (kept once ``done`` is called for it)
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._work, name=f"tracker-{tracker.name}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while True:
            item = self.calls.get()
            try:
                if item is None:
                    return
                what, step, payload = item
                try:
                    if what == "log":
                        self.tracker.log(payload)
                        self.taken = step
                        if self.tracker.durable:
                            self.done(self.tracker.name, step)
                    elif what == "samples":
                        self.tracker.samples(step, payload)
                    else:
                        self.tracker.close(payload)
                except Exception as e:  # a tracker never stops training: counted, reported at the end
                    self.failed(self.tracker.name, f"{what} at step {step}", e)
            finally:
                self.calls.task_done()

    def put(self, what: str, step: int, payload) -> None:
        self.calls.put((what, step, payload))

    def wait(self, timeout: float) -> bool:
        """Every call so far handled, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.calls.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


class Trackers:
    """The run's trackers (``loggers``), fed each metric row and each evaluation's samples.

    ``resume_step``: the checkpoint step of a resumed run, -1 for a fresh one."""

    def __init__(self, loggers: list[str], run_dir: Path, params: dict, resume_step: int) -> None:
        self.run_dir = run_dir
        saved = tracker_ids(run_dir, resume_step)
        active = [name for name in loggers if name != "tensorboard"]
        # a tracker a resume leaves out keeps its entry: named again later, it continues its run
        self.state: dict[str, dict] = saved | {name: saved.get(name, {}) for name in active}
        self.failures: dict[str, int] = {}
        self.dead: set[str] = set()  # a tracker that did not take its rows within a flush: not waited for again
        self._lock = threading.Lock()
        self.local: list[TensorBoard] = []
        self.background: dict[str, _Background] = {}
        try:
            if "tensorboard" in loggers:
                self.local.append(TensorBoard(run_dir, resume_step))
            for name in active:
                kind = WandB if name == "wandb" else MLflow
                try:
                    make = lambda k=kind, n=name: k(run_dir, params, self.state[n], resume_step)  # noqa: E731
                    tracker = start_within(name, make, START_TIMEOUT_S)
                except ConfigError as e:
                    raise ConfigError(redact(str(e))) from None
                except Exception as e:
                    raise ConfigError(
                        redact(f"loggers: {name} could not start its run: {type(e).__name__}: {e}")
                    ) from None
                if 0 <= resume_step < self.state[name].get("last_step", -1) and tracker.redoes:
                    self.state[name]["last_step"] = resume_step  # kept is what the checkpoint covers: redo after it
                self.background[name] = _Background(tracker, self._took, self._failed)
                self._save()
        except BaseException:
            self.close("FAILED")
            raise

    def _took(self, name: str, step: int) -> None:
        with self._lock:
            self.state[name]["last_step"] = step
            self._save()

    def _save(self) -> None:
        save_tracker_ids(self.run_dir, self.state)

    def _failed(self, name: str, what: str, e: Exception) -> None:
        with self._lock:
            self.failures[name] = self.failures.get(name, 0) + 1
            first = self.failures[name] == 1
        if first:
            msg = redact(f"{type(e).__name__}: {e}").splitlines()[0][:300]
            print(
                f"warning: tracker {name}: {what} failed ({msg}); training goes on, later failures are counted "
                "(summary.json: tracker_failures)",
                file=sys.stderr,
                flush=True,
            )

    def _new(self, name: str, step: int) -> bool:
        return step > self.state[name].get("last_step", -1)

    def log(self, row: dict) -> None:
        for t in self.local:
            t.log(row)
        for name, bg in self.background.items():
            if self._new(name, row["step"]):
                bg.put("log", row["step"], row)

    def samples(self, step: int, rows: list[dict]) -> None:
        if not rows:
            return
        for t in self.local:
            t.samples(step, rows)
        for name, bg in self.background.items():
            if self._new(name, step):
                bg.put("samples", step, rows)

    def flush(self) -> None:
        """Every row so far delivered or counted as failed (before a checkpoint: a resume starts after it)."""
        for t in self.local:
            t.flush()
        for name, bg in self.background.items():
            if name in self.dead and not bg.wait(0.0):  # still behind: not waited for at every checkpoint
                continue
            self.dead.discard(name)  # caught up
            if not bg.wait(FLUSH_TIMEOUT_S):
                self.dead.add(name)
                self._failed(name, f"delivering within {FLUSH_TIMEOUT_S:.0f} s", TimeoutError("no answer"))
                continue
            if not bg.tracker.durable and bg.taken > self.state[name].get("last_step", -1):  # new rows only
                bg.tracker.flush()
                self._took(name, bg.taken)

    def close(self, status: str = "FINISHED") -> None:
        """``status``: FINISHED, KILLED (stopped by a signal) or FAILED, as the tracker run ends."""
        for t in self.local:
            t.close(status)
        for name, bg in self.background.items():
            bg.put("close", -1, status)
            bg.calls.put(None)
            if not bg.wait(FLUSH_TIMEOUT_S):  # the end waits once more, even for a tracker seen dead
                left = bg.calls.unfinished_tasks
                self._failed(name, f"the last {left} calls, not delivered in {FLUSH_TIMEOUT_S:.0f} s", TimeoutError())
            elif not bg.tracker.durable and bg.taken >= 0:
                self._took(name, bg.taken)  # a finished W&B run has written everything
        self.local, self.background = [], {}

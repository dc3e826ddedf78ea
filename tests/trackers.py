"""A real MLflow tracking server for the tests (``mlflow server`` on SQLite, in its own session), readers
of what a run left in each tracker (an MLflow run's metric history, a W&B offline run's history: its
``.wandb`` files, read as W&B's own sync reads them), and what a tracker must hold of ``metrics.jsonl``
(written here on purpose, not taken from ``pc_megatron/run/trackers.py``, whose rule it checks)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def numbers(row: dict) -> dict[str, float]:
    """A metric row's finite numbers, ``step`` aside: what every tracker takes of it."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def tracked(rows: list[dict], key=str) -> dict[str, list[tuple[int, float]]]:
    """What a tracker must hold of metrics.jsonl's ``rows``: ``name -> [(step, value), ...]`` of every
    finite number (``key``: the tracker's name for a metric)."""
    out: dict[str, list] = {}
    for row in rows:
        for k, v in numbers(row).items():
            out.setdefault(key(k), []).append((row["step"], v))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``(uri, process)`` of a tracking server with a SQLite store in ``folder``, up until the block ends."""
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{folder}/mlflow.db",
        "--artifacts-destination",
        str(folder / "artifacts"),
    ]
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    tail = (folder / "server.log").read_text()[-2000:]
                    raise RuntimeError(f"mlflow server did not start: {tail}") from None
                time.sleep(0.2)
        yield uri, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def mlflow_runs(uri: str, experiment: str = "pc-megatron") -> list:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def mlflow_history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """``key -> [(step, value), ...]`` of every metric of the run, in step order."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def mlflow_latest(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """``key -> [(step, value), ...]``: at each step the value logged last (a resume logs the steps it
    redoes again; MLflow keeps every value, the latest is the run's)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    out = {}
    for k in client.get_run(run_id).data.metrics:
        latest: dict[int, tuple[int, float]] = {}
        for m in client.get_metric_history(run_id, k):
            if m.step not in latest or m.timestamp >= latest[m.step][0]:
                latest[m.step] = (m.timestamp, m.value)
        out[k] = sorted((step, v) for step, (_, v) in latest.items())
    return out


def wandb_records(path: Path):
    """The records of one ``.wandb`` file: LevelDB's log format (32 KiB blocks of chunks, each with a
    7-byte header: CRC, length, type) after a 7-byte W&B header, each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B data file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(wandb_dir: Path) -> tuple[set[str], list[dict]]:
    """The run ids and the history rows (``_step`` and the logged keys) of every offline run in ``wandb_dir``,
    in the order they were written."""
    import json

    ids, rows = set(), []
    for f in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                ids.add(r.run.run_id)
            elif kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return ids, rows

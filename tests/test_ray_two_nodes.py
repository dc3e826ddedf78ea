"""Two Ray nodes on one machine: two network namespaces joined by a veth pair, a Ray node in
each, learner ranks on both (PP=2 over gloo across the namespaces), three RL steps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="runtime=ray needs ray (in the test extra)")

from pc_megatron.observability import read_metrics
from tests.settings import SMALL

NODES = (("pcmA", "10.77.0.1"), ("pcmB", "10.77.0.2"))  # addresses inside our own namespaces only
PORT = 6390
BIN = Path(sys.executable).parent


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)


def _in(ns: str, *cmd: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    pre = ["ip", "netns", "exec", ns, "env", *(f"{k}={v}" for k, v in (env or {}).items())]
    return subprocess.run([*pre, *cmd], check=check, capture_output=True, text=True, timeout=900)


TEMP = {ns: Path(f"/tmp/pcm-ray-{ns}") for ns, _ in NODES}  # short: Ray's socket paths stay < 107 bytes


def _teardown() -> None:
    """End every process inside our namespaces (not `ray stop`, which ends every Ray process on
    the machine, a test run's own included), then remove them."""
    for ns, _ in NODES:
        if Path(f"/var/run/netns/{ns}").exists():
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        _run("ip", "netns", "del", ns, check=False)
        shutil.rmtree(TEMP[ns], ignore_errors=True)


@pytest.fixture
def two_nodes():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("network namespaces need root and iproute2 (`ip netns`)")
    _teardown()
    try:
        for ns, _ in NODES:
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", "pcm-a", "type", "veth", "peer", "name", "pcm-b")
        for (ns, ip), end in zip(NODES, ("pcm-a", "pcm-b"), strict=True):
            _run("ip", "link", "set", end, "netns", ns)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", end, "name", "pcm0")
            _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", "pcm0")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "pcm0", "up")
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        _teardown()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip() or e}")
    env = {"RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "pcm0", "OMP_NUM_THREADS": "1"}
    (head_ns, head_ip), (node_ns, node_ip) = NODES
    try:
        _in(head_ns, str(BIN / "ray"), "start", "--head", f"--node-ip-address={head_ip}", f"--port={PORT}",
            "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={TEMP[head_ns]}", env=env)  # fmt: skip
        _in(node_ns, str(BIN / "ray"), "start", f"--address={head_ip}:{PORT}", f"--node-ip-address={node_ip}",
            "--num-cpus=1", f"--temp-dir={TEMP[node_ns]}", env=env)  # fmt: skip
        yield head_ns, f"{head_ip}:{PORT}", env
    finally:
        _teardown()


def test_three_steps_with_learner_ranks_on_two_nodes(cache_dir, tmp_path, two_nodes):
    head_ns, address, env = two_nodes
    args = [*SMALL, "algo.loss.entropy_coef=0.05", "steps=3", "runtime=ray", f"ray.address={address}"]
    args += ["ray.bundles_per_node=1", "learner.pipeline_parallel_size=2", f"out_dir={tmp_path}", "name=two"]
    env = {**env, "PC_MEGATRON_CACHE": str(cache_dir), "PATH": os.environ["PATH"]}
    proc = _in(head_ns, str(BIN / "pc-megatron"), "train", "tiny", *args, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    placement = json.loads((tmp_path / "two" / "placement.json").read_text())
    assert sorted(placement["learner"]) == ["10.77.0.1", "10.77.0.2"]
    rows = read_metrics(tmp_path / "two")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["logprob_mismatch_max"] < 1e-4 and r["engine_weight_version"] == r["step"] for r in rows[1:])

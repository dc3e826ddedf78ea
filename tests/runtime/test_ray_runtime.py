"""runtime=ray (``pc_megatron/runtime/ray_runtime.py``) on one machine: learner ranks over gloo and engine
replicas as Ray actors give the one-process run's rollouts and update; faults are one clear error and
the run resumes. And on two Ray nodes: two network namespaces joined by a veth pair, a Ray node in
each, learner ranks on both (PP=2 over gloo across the namespaces), three RL steps."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray", reason="runtime=ray needs ray (in the test extra)")

from pc_megatron.config import load_config
from pc_megatron.run.logs import read_metrics
from pc_megatron.runtime.ray_runtime import split_by_samples
from pc_megatron.train import train
from tests.settings import SMALL, comparable

# the SMALL test model has one kv head; TP=2 needs two
TWO_KV = ["model.tiny.num_kv_heads=2"]
# the test model solves nothing at first (zero advantages): an entropy bonus makes the update move
MOVING = ["algo.loss.entropy_coef=0.05", "checkpoint.every_steps=1"]


def test_requests_split_across_replicas_by_samples():
    assert split_by_samples([4] * 8, 2) == [(0, 4), (4, 8)]
    assert split_by_samples([1, 1, 6], 2) == [(0, 2), (2, 3)]
    assert split_by_samples([3], 4) == [(0, 1)]
    assert split_by_samples([2, 2, 2, 2, 2, 2], 3) == [(0, 2), (2, 4), (4, 6)]


def _same_step_one(local: list[dict], ray_rows: list[dict]) -> None:
    assert [r["step"] for r in ray_rows] == [r["step"] for r in local]
    assert local[0]["eval_accuracy"] == ray_rows[0]["eval_accuracy"]
    a, b = local[1], ray_rows[1]
    assert a["cum_generated_tokens"] == b["cum_generated_tokens"] and a["reward_mean"] == b["reward_mean"]
    assert abs(a["loss"] - b["loss"]) < 1e-6
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"]
    for r in ray_rows[1:]:
        assert r["logprob_mismatch_max"] < 1e-4 and r["engine_weight_version"] == r["step"]


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(["learner.pipeline_parallel_size=2"], id="pp2"),
        pytest.param([*TWO_KV, "learner.tensor_parallel_size=2", "rollout.replicas=2"], id="tp2-two-replicas"),
        pytest.param(["learner.data_parallel_size=2", "learner.distributed_optimizer=true"], id="dp2"),
    ],
)
def test_ray_layouts_match_the_local_run(cache_dir, tmp_path, layout):
    model = [o for o in layout if o.startswith("model.")]
    common = [*SMALL, *MOVING, *model, "steps=2"]
    train(load_config("tiny", common), tmp_path / "local")
    train(load_config("tiny", [*common, *layout, "runtime=ray"]), tmp_path / "ray")
    _same_step_one(read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray"))
    if "learner.pipeline_parallel_size=2" in layout:  # its PP=2 checkpoint resumes in one process
        saved = load_config(str(tmp_path / "ray" / "config.yaml"), ["steps=3", "runtime=local"])
        train(
            load_config(
                str(tmp_path / "ray" / "config.yaml"), ["steps=3", "runtime=local", "learner.pipeline_parallel_size=1"]
            ),
            tmp_path / "ray",
            resume=True,
        )
        rows = read_metrics(tmp_path / "ray")
        assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[3]["policy_version"] == 3 == saved.steps
        assert rows[3]["logprob_mismatch_max"] < 1e-4


@pytest.mark.slow  # ~130 s on 2 cores; the vLLM engine and runtime=ray each have default-tier tests
def test_ray_with_the_vllm_engine_matches_the_local_run(cache_dir, tmp_path):
    pytest.importorskip("vllm")
    common = [*SMALL, *MOVING, "steps=2", "rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.125"]
    train(load_config("tiny", common), tmp_path / "local")
    train(load_config("tiny", [*common, "runtime=ray", "learner.pipeline_parallel_size=2"]), tmp_path / "ray")
    _same_step_one(read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray"))


def _cli(args: list[str], cache_dir) -> subprocess.Popen:
    env = {**os.environ, "PC_MEGATRON_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "pc_megatron.cli", "train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def test_a_killed_engine_actor_stops_the_run_clearly_and_resume_reproduces_it(cache_dir, tmp_path):
    common = ["tiny", *SMALL, *MOVING, "steps=4", "runtime=ray", f"out_dir={tmp_path}"]
    assert _cli([*common, "name=full"], cache_dir).wait(timeout=600) == 0
    proc = _cli([*common, "name=killed"], cache_dir)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    # this run's engine actors (its Ray instance is its own: they descend from it), not another run's
    engines = [p for p in psutil.Process(proc.pid).children(recursive=True) if "ray::EngineWorker" in _cmdline(p)]
    assert engines, "no engine actor process found"
    t_kill = time.time()
    for p in engines:
        p.kill()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and time.time() - t_kill < 60
    assert "engine replica 0" in err and "died" in err and "--resume" in err, err[-3000:]
    resumed = _cli(["--resume", str(tmp_path / "killed")], cache_dir)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    full, again = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "killed")
    assert [r["step"] for r in again] == [r["step"] for r in full]
    for a, b in zip(full, again, strict=True):
        assert comparable(a) == comparable(b), f"step {a['step']} differs"


def test_an_engine_call_past_its_deadline_is_one_clear_error(cache_dir, tmp_path):
    from pc_megatron.errors import TrainingError

    cfg = load_config("tiny", [*SMALL, "steps=1", "runtime=ray", "rollout.timeout_s=0.01"])
    with pytest.raises(TrainingError, match=r"engine replica 0 \(node .*\) did not answer within 0.01 s.*--resume"):
        train(cfg, tmp_path / "run")
    import ray

    assert not ray.is_initialized()  # a failed start leaves no Ray instance behind


@pytest.mark.slow  # two vLLM CPU workers start in ~40 s, beside a learner actor, on 2 cores
def test_a_two_worker_vllm_replica_under_ray_matches_the_one_process_run(cache_dir, tmp_path):
    """An engine replica of tensor_parallel_size=2 (two vLLM CPU worker processes, each bound to
    its own core, the replica holding two bundles): each sync reaches both workers (the engine's
    log-probs are the learner's), and the run is the local one-worker run up to the two-way
    all-reduce's rounding."""
    import json

    pytest.importorskip("vllm")
    common = [*SMALL, *MOVING, "steps=2", "rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.125"]
    train(load_config("tiny", common), tmp_path / "local")
    train(load_config("tiny", [*common, "runtime=ray", "rollout.vllm.tensor_parallel_size=2"]), tmp_path / "ray")
    routes = json.loads((tmp_path / "ray" / "placement.json").read_text())["weight_sync_routes"]
    assert [(r["sender"], r["transport"]) for r in routes] == [(0, "shm"), (0, "shm")]  # one replica, two workers
    local, ray_rows = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    assert local[0]["eval_accuracy"] == ray_rows[0]["eval_accuracy"]
    a, b = local[1], ray_rows[1]
    assert a["cum_generated_tokens"] == b["cum_generated_tokens"] and a["reward_mean"] == b["reward_mean"]
    assert abs(a["loss"] - b["loss"]) < 1e-5
    for r in ray_rows[1:]:
        assert r["logprob_mismatch_max"] < 1e-4 and r["engine_weight_version"] == r["step"]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "layout",
    [
        # one replica of two vLLM workers: each matched by GPU identity to the learner rank on its GPU
        pytest.param(
            [*TWO_KV, "learner.tensor_parallel_size=2", "rollout.vllm.tensor_parallel_size=2"], id="engine-tp2"
        ),
        # two one-GPU replicas: every bucket's load starts on both before the sync waits for either
        pytest.param(["learner.data_parallel_size=2", "rollout.replicas=2"], id="two-replicas"),
    ],
)
def test_colocated_vllm_on_two_gpus_takes_each_sync_by_cuda_ipc_on_its_own_gpu(cache_dir, tmp_path, layout):
    """runtime=ray on two GPUs, each shared by a learner rank and a vLLM engine worker: every route is
    CUDA IPC from the learner rank that reports the worker's own GPU (not the one its bundle index
    suggests), and each sync reaches every worker: the engines' log-probs are the learner's to bf16
    precision and serve the learner's version, over several buckets per sync."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("two colocated learner ranks and engine workers need two GPUs")
    pytest.importorskip("vllm")
    gpu = ["rollout.backend=vllm", "learner.bf16=true", "rollout.vllm.gpu_memory_utilization=0.3"]
    run = ["steps=3", "runtime=ray", "rollout.weight_sync.bucket_mb=1"]
    cfg = load_config("tiny", [*SMALL, *MOVING, *layout, *gpu, *run])
    train(cfg, tmp_path / "run")
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    routes, gpus = placement["weight_sync_routes"], placement["learner_gpus"]
    assert len(routes) == 2 and {r["transport"] for r in routes} == {"cuda_ipc"}
    assert len(set(gpus)) == 2 and all(r["gpu"] == gpus[r["sender"]] for r in routes)
    assert {r["gpu"] for r in routes} == set(gpus)  # one worker on each GPU
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["engine_weight_version"] == r["policy_version"], r["step"]
        assert r["logprob_mismatch_max"] < 0.1, (r["step"], r["logprob_mismatch_max"])  # bf16; a lost shard: O(1)


@pytest.mark.gpu
def test_ray_with_vllm_colocated_on_one_gpu(cache_dir, tmp_path):
    """runtime=ray on one GPU: the learner rank and the vLLM engine share it (fractional bundle), the engine
    sleeps while the learner trains and takes each sync by CUDA IPC on that GPU; the engine serves the
    learner's version with bf16-close log-probs."""
    pytest.importorskip("vllm")
    gpu = ["rollout.backend=vllm", "learner.bf16=true", "rollout.vllm.gpu_memory_utilization=0.3"]
    cfg = load_config("tiny", [*SMALL, *MOVING, *gpu, "steps=3", "runtime=ray"])
    train(cfg, tmp_path / "run")
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    routes = placement["weight_sync_routes"]
    assert [r["transport"] for r in routes] == ["cuda_ipc"] and routes[0]["gpu"] == placement["learner_gpus"][0]
    rows = read_metrics(tmp_path / "run")
    for r in rows[1:]:
        assert r["engine_weight_version"] == r["policy_version"], r["step"]
        assert r["logprob_mismatch_max"] < 0.1, (r["step"], r["logprob_mismatch_max"])


BROADCAST = ["ray.placement=split", "rollout.weight_sync.transport=broadcast", "rollout.replicas=2"]


def test_broadcast_weight_sync_into_split_engines_matches_the_local_run(cache_dir, tmp_path):
    """Two hf engine replicas on bundles of their own take every sync as one gloo broadcast per
    bucket from learner rank 0 (small buckets: several per sync): the run is the local run."""
    import json

    common = [*SMALL, *MOVING, "steps=2", "rollout.backend=hf", "rollout.weight_sync.bucket_mb=1"]
    train(load_config("tiny", common), tmp_path / "local")
    train(load_config("tiny", [*common, "runtime=ray", *BROADCAST]), tmp_path / "ray")
    placement = json.loads((tmp_path / "ray" / "placement.json").read_text())
    assert {r["transport"] for r in placement["weight_sync_routes"]} == {"broadcast"} and len(placement["engines"]) == 2
    local, ray_rows = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    _same_step_one(local, ray_rows)
    for a, b in zip(local[1:], ray_rows[1:], strict=True):
        assert a["weight_sync_bytes"] == b["weight_sync_bytes"] and b["weight_sync_gbps"] > 0


@pytest.mark.slow  # the vLLM CPU engine starts in ~35 s
def test_broadcast_weight_sync_into_vllm_workers_matches_the_local_run(cache_dir, tmp_path):
    """The vLLM worker process joins through collective_rpc and takes each bucket's broadcast.
    One replica: two vLLM engines starting at once on a 2-core machine starve the reward
    workers' start (the two-replica rank layout is the hf test's)."""
    import json

    pytest.importorskip("vllm")
    common = [*SMALL, *MOVING, "steps=2", "rollout.backend=vllm", "rollout.vllm.cpu_kv_cache_gb=0.125"]
    train(load_config("tiny", common), tmp_path / "local")
    train(load_config("tiny", [*common, "runtime=ray", *BROADCAST[:2]]), tmp_path / "ray")
    routes = json.loads((tmp_path / "ray" / "placement.json").read_text())["weight_sync_routes"]
    assert {r["transport"] for r in routes} == {"broadcast"}
    _same_step_one(read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray"))


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
    token = secrets.token_hex(32)  # the job's own, as tools/slurm/pc-megatron.sbatch makes it
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "GLOO_SOCKET_IFNAME": "pcm0", "OMP_NUM_THREADS": "1"}
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
    # the cluster lets a run join only with its token: none, or another, is refused in one clear line
    for bad, says in (("", "needs the cluster's token: export RAY_AUTH"), ("0" * 64, "did not let this run join")):
        proc = _in(head_ns, str(BIN / "pc-megatron"), "train", "tiny", *args, "name=refused",
                   env={**env, "RAY_AUTH_TOKEN": bad}, check=False)  # fmt: skip
        assert proc.returncode != 0 and says in proc.stderr, proc.stderr[-3000:]
        assert not (tmp_path / "refused" / "metrics.jsonl").exists()
    proc = _in(head_ns, str(BIN / "pc-megatron"), "train", "tiny", *args, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    placement = json.loads((tmp_path / "two" / "placement.json").read_text())
    assert sorted(placement["learner"]) == ["10.77.0.1", "10.77.0.2"]
    rows = read_metrics(tmp_path / "two")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["logprob_mismatch_max"] < 1e-4 and r["engine_weight_version"] == r["step"] for r in rows[1:])

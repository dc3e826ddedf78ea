"""The Ray cluster a ``runtime=ray`` run uses, and where its actors go.

Joining or starting Ray (``ray.address``; an address that does not answer fails within
``ray.connect_timeout_s``, naming it), and placement: per node one placement group of
``ray.bundles_per_node`` bundles (``{GPU: 1, CPU: c}`` on GPU clusters, ``{CPU: c}`` on CPU-only
ones), strictly packed, ordered by node address and bundle index. ``colocated`` (default): learner
rank i and engine worker i share bundle i, each with half of it (fractional GPU); ``split``: engines
get bundles of their own after the learner's. An engine replica's workers never cross a node. The
roles themselves (learner ranks, engine replicas) are ``ray_runtime.py``'s.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pc_megatron.errors import ConfigError, check_choices
from pc_megatron.rollout.base import RolloutConfig


@dataclass
class RayConfig:
    """Ray placement (runtime=ray)."""

    address: str = ""
    """'' = start a Ray instance for this run (one machine); 'auto' or HOST:PORT = join the
    cluster started with `ray start --head` / `ray start --address=...`."""
    placement: Literal["colocated", "split"] = "colocated"
    """'colocated': learner rank i and engine replica i share bundle i (fractional GPU);
    'split': engines get bundles (GPUs) of their own."""
    bundles_per_node: int = 0
    """Bundles per placement group (one group per node); 0 = the node's GPU count on GPU
    clusters, all bundles in one group on CPU-only ones."""
    cpus_per_bundle: float = 1.0
    """CPUs in each bundle."""
    num_cpus: int = 0
    """A Ray instance started for this run: CPUs it may schedule (0 = enough for the bundles)."""
    object_store_mb: int = 1024
    """A Ray instance started for this run: object-store size (it falls back to /tmp when
    /dev/shm is small)."""
    temp_dir: str = ""
    """Ray's session and log folder; '' = <run dir>/ray (or a short link to it: Ray's socket
    paths must stay under 107 characters)."""
    call_timeout_s: float = 3600.0
    """Deadline of one learner call (a step's log-probs or update, a checkpoint)."""
    connect_timeout_s: float = 60.0
    """Joining a cluster (ray.address): the head must answer within this many seconds."""

    def validate(self) -> None:
        check_choices(self, "ray")
        if self.bundles_per_node < 0 or self.cpus_per_bundle <= 0 or self.call_timeout_s <= 0:
            raise ConfigError("ray.bundles_per_node must be >= 0, ray.cpus_per_bundle and ray.call_timeout_s > 0")
        if self.connect_timeout_s <= 0:
            raise ConfigError("ray.connect_timeout_s must be > 0")


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            f"runtime=ray needs Ray ({e}): pip install 'ray[default]' (the gpu and test extras have it)"
        ) from None
    return ray


def _temp_dir(rcfg: RayConfig, run_dir: Path) -> str:
    want = Path(rcfg.temp_dir) if rcfg.temp_dir else run_dir.resolve() / "ray"
    if len(str(want)) <= 60:
        want.mkdir(parents=True, exist_ok=True)
        return str(want)
    short = Path("/tmp") / f"pcm-ray-{hashlib.sha1(str(want).encode()).hexdigest()[:10]}"
    short.mkdir(parents=True, exist_ok=True)
    if not want.exists():
        want.parent.mkdir(parents=True, exist_ok=True)
        want.symlink_to(short, target_is_directory=True)
    return str(short)


def start_ray(rcfg: RayConfig, run_dir: Path, cpus_needed: float) -> None:
    """Join or start Ray with the environment the project needs (token auth off for a local
    instance, the temp folder in the run directory, actors' thread counts pinned)."""
    ray = _ray()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.59+ turns token auth on for local clusters
    env = {
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"],
        **{
            k: v
            for k, v in os.environ.items()
            if k.startswith(("PC_MEGATRON_", "HF_", "VLLM_", "TRITON_", "GLOO_", "NCCL_"))
        },
    }
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": True, "include_dashboard": False}
    if rcfg.address:  # train() has checked that it answers (check_reachable)
        ray.init(address=rcfg.address, **kwargs)
    else:
        ray.init(
            num_cpus=rcfg.num_cpus or math.ceil(cpus_needed),
            object_store_memory=rcfg.object_store_mb << 20,
            _temp_dir=_temp_dir(rcfg, run_dir),
            **kwargs,
        )


def check_reachable(address: str, timeout_s: float) -> None:
    """A ``HOST:PORT`` cluster address answers a TCP connection within ``timeout_s``; else one
    ``ConfigError`` naming the address tried (Ray itself would retry its GCS connection for minutes,
    silently). ``auto`` is left to Ray, which fails at once when it finds no local cluster."""
    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"ray.address={address!r}: expected HOST:PORT (e.g. 10.0.0.1:6379) or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(
            f"no Ray cluster answers at {host}:{port} ({e.strerror or type(e).__name__}, within "
            f"ray.connect_timeout_s={timeout_s:g} s): start a head node there with `ray start --head "
            f"--port={port}`, or leave ray.address empty for a Ray instance of this run's own"
        ) from None


@dataclass
class Bundle:
    group: Any  # the placement group
    index: int
    node: str


def place_bundles(rcfg: RayConfig, count: int, timeout_s: float = 120.0) -> list[Bundle]:
    """``count`` bundles in per-node placement groups (strict pack), ordered by (node, index)."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    gpus = int(ray.cluster_resources().get("GPU", 0))
    bundle = {"CPU": rcfg.cpus_per_bundle, **({"GPU": 1} if gpus else {})}
    per_node = rcfg.bundles_per_node
    if not per_node:
        per_node = max(int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]) if gpus else count
    sizes = [min(per_node, count - start) for start in range(0, count, per_node)]
    groups = [placement_group([bundle] * n, strategy="STRICT_PACK") for n in sizes]
    ready = [g.ready() for g in groups]
    done, _ = ray.wait(ready, num_returns=len(ready), timeout=timeout_s)
    if len(done) < len(ready):
        for g in groups:
            ray.util.remove_placement_group(g)
        raise ConfigError(
            f"Ray cannot place {count} bundles of {bundle} in groups of {per_node} per node within {timeout_s:g} s; "
            f"the cluster has {ray.cluster_resources()}: add nodes or lower the learner/engine counts"
        )
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    out = []
    for g in groups:
        table = placement_group_table(g)
        for i in range(len(table["bundles"])):
            out.append(Bundle(g, i, nodes.get(table["bundles_to_node_id"][i], "?")))
    return sorted(out, key=lambda b: (b.node, id(b.group), b.index))


def engine_tp(rc: Any) -> int:
    """Bundles (GPUs) per engine replica: the vLLM engine's tensor-parallel size; the hf engine is one process."""
    return rc.vllm.tensor_parallel_size if rc.backend == "vllm" else 1


def replica_slices(bundles: list[Bundle], replicas: int, tp: int) -> list[list[Bundle]]:
    """Replica r takes bundles [r*tp, (r+1)*tp) of one node and one placement group (an engine's
    tensor-parallel workers never cross a node)."""
    out = [bundles[r * tp : (r + 1) * tp] for r in range(replicas)]
    for r, part in enumerate(out):
        if len({(b.node, id(b.group)) for b in part}) > 1:
            raise ConfigError(
                f"engine replica {r} (tensor_parallel_size={tp}) would span nodes "
                f"{sorted({b.node for b in part})}: make ray.bundles_per_node a multiple of "
                "rollout.vllm.tensor_parallel_size (and of the learner's ranks per node)"
            )
    return out


def actor_options(bundle: Bundle, cpus: float, gpus: float, capture: bool = False) -> dict:
    """Actor options for ``bundle``; ``capture``: the actor's own tasks and actors (vLLM's Ray
    workers) are placed in the same placement group."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        bundle.group, placement_group_bundle_index=bundle.index, placement_group_capture_child_tasks=capture
    )
    return {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy}


def engine_config(rc: RolloutConfig, placement: str) -> RolloutConfig:
    """The rollout config the engine replicas are built with: engines on GPUs of their own
    (``split``) never sleep (nothing shares their memory), so ``sleep_level`` is 0 there."""
    out = copy.deepcopy(rc)
    if placement == "split":
        out.vllm.sleep_level = 0
    return out

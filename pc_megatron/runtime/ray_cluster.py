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

import contextlib
import copy
import hashlib
import math
import os
import secrets
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pc_megatron.errors import ConfigError
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.runtime.config import RayConfig


def _ray():
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            f"runtime=ray needs Ray ({e}): pip install 'ray[default]' (the gpu and test extras have it)"
        ) from None
    return ray


def _temp_dir(rcfg: RayConfig, run_dir: Path) -> str:
    """Ray's temp folder for this run (sockets, logs, the session's files), always inside a 0700 folder of
    this user's: Ray opens its own folders to all (0777), so only a private folder around them keeps another
    local user from swapping a socket or reading what passes through it. Beside the run (``run/ray/p/r``)
    when that path is short enough for Ray's socket paths, else under ``/tmp`` (linked from ``run/ray``)."""
    want = Path(rcfg.temp_dir) if rcfg.temp_dir else run_dir.resolve() / "ray"
    if len(str(want / "p" / "r")) <= 60:
        want.mkdir(parents=True, exist_ok=True)
        private = want / "p"
    else:
        private = Path("/tmp") / f"pcm-ray-{os.getuid()}-{hashlib.sha1(str(want).encode()).hexdigest()[:10]}"
    with contextlib.suppress(FileExistsError):
        private.mkdir(mode=0o700)
    _check_own_folder(private)
    inner = private / "r"
    inner.mkdir(exist_ok=True)
    if not want.exists():
        want.parent.mkdir(parents=True, exist_ok=True)
        want.symlink_to(inner, target_is_directory=True)
    return str(inner)


def _check_own_folder(folder: Path) -> None:
    """The folder Ray's session folder goes into: ours, and nobody else may enter it (another user could
    otherwise have made it first, or reach Ray's 0777 folders through it and place sockets or files there)."""
    st = folder.lstat()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{folder} (around Ray's session folder for this run) is not a folder of this user's that only this user "
            f"may enter (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): remove it, or set ray.temp_dir to "
            "a folder of your own"
        )


FORWARDED_PREFIXES = ("PC_MEGATRON_", "VLLM_", "TRITON_", "GLOO_", "NCCL_")
FORWARDED_HF = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_CACHE",
    "HF_DATASETS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
    "HF_ENDPOINT",
    "TRANSFORMERS_OFFLINE",
)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def forwarded_env(environ: dict[str, str]) -> dict[str, str]:
    """The driver's variables the actors get through Ray's runtime environment, which Ray stores and
    shows (dashboard, state API): the project's, vLLM's, Triton's and the collectives' settings and the
    Hugging Face cache and offline switches, never a variable whose name says it is a secret
    (``HF_TOKEN``, ``*_API_KEY``, ...). Workers read models from the cache and need no credentials."""
    out = {}
    for k, v in environ.items():
        if not (k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_HF):
            continue
        if any(word in k.upper() for word in SECRET_WORDS):
            continue
        out[k] = v
    return {**NCCL_DEFAULTS, **out}  # the user's own setting wins


NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}
"""NCCL settings the actors get unless the user sets them: NVLink SHARP off, the setup of open NCCL reports
of hangs and permuted all-gathers on NVSwitch nodes with one GPU per process and TP groups (the production
target, H200), until a GPU test shows it safe. ``pc-megatron plan`` says so."""


def _token_auth(rcfg: RayConfig) -> str:
    """Token authentication, on unless ``RAY_AUTH_MODE=disabled`` is set. A Ray instance of the run's
    own gets a fresh secret in this process's environment (inherited by the processes Ray starts, never
    written to a file, $HOME included); joining a cluster needs the token the head was started with."""
    mode = os.environ.setdefault("RAY_AUTH_MODE", "token")
    if mode != "token":
        print(
            f"RAY_AUTH_MODE={mode}: the Ray cluster accepts anyone who reaches its ports (its services listen on "
            "every interface) and runs their code as this user; unset it for token auth",
            file=sys.stderr,
        )
        return mode
    if not rcfg.address:
        if not os.environ.get("RAY_AUTH_TOKEN"):
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        return mode
    check_join_token(rcfg.address)
    return mode


def check_join_token(address: str) -> None:
    """Joining a cluster with token authentication (``RAY_AUTH_MODE`` unset or ``token``) needs the
    cluster's token at hand: one ConfigError before any run folder exists, else Ray's own error comes
    after the run has started."""
    if os.environ.get("RAY_AUTH_MODE", "token") != "token":
        return
    home_token = Path.home() / ".ray" / "auth_token"
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or home_token.is_file()):
        raise ConfigError(
            f"ray.address={address}: joining a cluster with token authentication (RAY_AUTH_MODE=token, the "
            "default) needs the cluster's token: export RAY_AUTH_TOKEN=<the token its head was started with> "
            "(tools/slurm/pc-megatron.sbatch and docker/multinode.sh make one per job), or set "
            "RAY_AUTH_MODE=disabled for a cluster started without authentication"
        )


def start_ray(rcfg: RayConfig, run_dir: Path, cpus_needed: float) -> None:
    """Join or start Ray with the environment the project needs (token authentication, the temp
    folder in the run directory, actors' thread counts pinned, an allowlist of forwarded variables)."""
    ray = _ray()
    if ray.is_initialized():
        return
    mode = _token_auth(rcfg)
    from ray._raylet import Config

    Config.initialize("")  # Ray reads RAY_AUTH_MODE when imported: read it again, as Ray's own token setup does
    env = {
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_AUTH_MODE": mode,
        **forwarded_env(dict(os.environ)),
    }
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": True, "include_dashboard": False}
    if rcfg.address:  # train() has checked that it answers (check_reachable)
        try:
            ray.init(address=rcfg.address, **kwargs)
        except ConnectionError as e:
            if mode != "token":
                raise
            raise ConfigError(
                f"the Ray cluster at {rcfg.address} answers but did not let this run join ({e}); with token "
                "authentication the usual cause is a RAY_AUTH_TOKEN other than the one its head was started with"
            ) from None
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

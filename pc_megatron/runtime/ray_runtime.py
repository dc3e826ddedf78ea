"""``runtime=ray``: learner ranks and engine replicas as Ray actors (the cluster and where each
actor goes: ``ray_cluster.py``).

Learner group: the ranks form one torch.distributed world (gloo on CPU, NCCL on GPU; rank 0's
node address and a free port as the rendezvous). A call fans out to every rank and returns rank
0's result (every rank returns the same one). Weight sync: every rank walks the export in
lockstep (gathers and broadcasts are collective); each engine worker's route
(``weight_sync/routes.py``) names its sender: colocated on GPU, the learner rank on the same GPU by
CUDA IPC; on CPU, shared memory from a rank on its node; split engines, one NCCL/gloo broadcast per
bucket from rank 0 into every engine process, over a process group of their own that rank 0 builds
on the first sync and keeps. The senders pack and load their buckets together
(``weight_sync/routed.py``).

Fleet: a request list is split into contiguous slices balanced by samples, one per replica; each
replica samples with the request list's global prompt indices (``first_prompt``), so K replicas
return what one would, in request order.

Faults: every remote call has a deadline (``ray.call_timeout_s``; engine calls
``rollout.timeout_s``); a dead actor or a missed deadline is one ``TrainingError`` naming the
role, rank and node. The driver then exits; the last checkpoint is intact and ``--resume``
continues from it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pc_megatron.errors import TrainingError, UserError
from pc_megatron.rollout.base import Completion, SamplingParams
from pc_megatron.runtime.ray_cluster import (
    RayConfig,
    actor_options,
    engine_config,
    engine_tp,
    place_bundles,
    replica_slices,
    start_ray,
)
from pc_megatron.weight_sync.routes import Slot, plan_routes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


# ---------------------------------------------------------------------------------- actors
class LearnerWorker:
    """One learner rank (a Ray actor)."""

    def __init__(self, rank: int, world: int, threads: int) -> None:
        import torch

        self.rank, self.world = rank, world
        torch.set_num_threads(threads)
        self.learner = None
        self._group: tuple[list, Any] | None = None  # rank 0: (engines, BroadcastGroup) of the broadcast transport
        self._senders: dict[str, Any] | None = None  # this rank's senders of routed syncs, by transport

    def address(self) -> tuple[str, int]:
        return _node_ip(), _free_port()

    def setup(self, master: tuple[str, int], model_dir: str, cfg: Any, seed: int) -> int:
        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",  # Ray shows each actor only its own GPU
        )
        from pc_megatron.learner import Learner

        self.learner = Learner(model_dir, cfg, seed)
        return self.learner.version

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(self.learner, method)(*args, **kwargs)
        return out if self.rank == 0 else None

    def version(self) -> int:
        return self.learner.version

    def push_weights(
        self, engines: list, manifest: Any, routes: list, bucket_bytes: int, verify: bool, timeout_s: float
    ) -> Any:
        """The learner's weights into every engine worker along ``routes`` (``weight_sync.routes``).
        Every rank walks the export (collectives). Broadcast: rank 0 sends to every engine process.
        Otherwise each rank packs for the workers it routes to (its colocated ones) and rank 0
        drives the engines with each worker's own handle (``weight_sync.routed``)."""
        named = self.learner.hf_named_tensors()
        if routes[0].transport == "broadcast":
            if self.rank != 0:
                for _ in named:
                    pass
                return None
            from pc_megatron.weight_sync.transport import make_sender, push_weights

            group = self._broadcast_group(engines, timeout_s)
            sender = make_sender("broadcast", bucket_bytes, group, verify)
            try:
                targets = [_RemoteEngine(e, i, timeout_s) for i, e in enumerate(engines)]
                return push_weights(named, manifest, sender, targets, self.learner.version)
            finally:
                sender.close()
        from pc_megatron.weight_sync.routed import WorldExchange, push_routed
        from pc_megatron.weight_sync.transport import make_sender

        mine = {i: r.transport for i, r in enumerate(routes) if r.sender == self.rank}
        if self._senders is None:  # kept across syncs: the buffers (and CUDA IPC handles) are reused
            self._senders = {kind: make_sender(kind, bucket_bytes, verify=verify) for kind in set(mine.values())}
        targets = []
        if self.rank == 0:
            workers: dict[int, list[int]] = {}
            for i, r in enumerate(routes):
                workers.setdefault(r.replica, []).append(i)
            targets = [(_RemoteEngine(e, k, timeout_s), workers[k]) for k, e in enumerate(engines)]
        return push_routed(
            named, manifest, bucket_bytes, self._senders, mine, targets, self.learner.version, WorldExchange()
        )

    def close_senders(self) -> None:
        for sender in (self._senders or {}).values():
            sender.close()
        self._senders = None

    def _broadcast_group(self, engines: list, timeout_s: float) -> Any:
        """Rank 0's broadcast group with every engine process, built on the first sync and kept
        while the engines are the same actors and the group is up (a failed collective closes
        it; the next sync builds a new one, which the engines see by its new key). The engines'
        join calls are started first, then rank 0 connects, all within ``timeout_s``."""
        import ray
        import torch

        from pc_megatron.weight_sync.broadcast_group import BroadcastGroup

        if self._group is not None:
            old_engines, group = self._group
            if old_engines == engines and group.alive:
                return group
            group.close()
            self._group = None
        names = [f"engine replica {i}" for i in range(len(engines))]
        counts = _get([e.sync_ranks.remote() for e in engines], names, timeout_s)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        group = BroadcastGroup.create(_node_ip(), sum(counts), timeout_s, device)
        refs, rank_names, first = [], [], 1
        for e, n, name in zip(engines, counts, names, strict=True):
            refs.append(e.join_group.remote(group.info, first))
            rank_names += [name if n == 1 else f"{name} (worker {w})" for w in range(n)]
            first += n

        def poll() -> None:  # a join call that ended before the group is up failed: say why now
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                _get([ref], [names[refs.index(ref)]], timeout_s)

        try:
            group.connect(rank_names, poll)
            _get(refs, names, timeout_s)
        except BaseException:
            group.close()
            raise
        self._group = (list(engines), group)
        return group


class EngineWorker:
    """One engine replica (a Ray actor) holding an hf or vllm engine."""

    def __init__(
        self, rollout_cfg: Any, model_dir: str, learner_bf16: bool, threads: int, ray_bundles: list[int] | None
    ) -> None:
        import torch

        from pc_megatron.rollout.engines import build_engine

        torch.set_num_threads(threads)
        self.engine = build_engine(rollout_cfg, model_dir, learner_bf16=learner_bf16, ray_bundles=ray_bundles)

    def manifest(self) -> Any:
        return self.engine.manifest

    def generate(self, *args: Any, **kwargs: Any) -> list[Completion]:
        return self.engine.generate(*args, **kwargs)

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        return self.engine.prompt_logprobs(prompts)

    def begin_sync(self) -> None:
        self.engine.begin_sync()

    def sync_ranks(self) -> int:
        """Processes that receive a broadcast sync (this actor, or each vLLM worker)."""
        return self.engine.sync_ranks()

    def join_group(self, info: dict, first_rank: int) -> str:
        """Join the broadcast group as ranks ``first_rank``..``first_rank + sync_ranks() - 1``."""
        return self.engine.join_group(info, first_rank)

    def load_bucket(self, handle: dict) -> int:
        return self.engine.load_bucket(handle)

    def end_sync(self, version: int, sent: int) -> int | None:
        return self.engine.end_sync(version, sent)

    def sleep(self) -> None:
        self.engine.sleep()

    def close(self) -> None:
        self.engine.close()


class _RemoteEngine:
    """A replica as a ``SyncTarget`` for rank 0's ``push_weights``."""

    def __init__(self, handle: Any, index: int, timeout_s: float) -> None:
        self.handle, self.index, self.timeout_s = handle, index, timeout_s

    def _get(self, ref: Any) -> Any:
        return _get([ref], [f"engine replica {self.index}"], self.timeout_s)[0]

    def begin_sync(self) -> None:
        self._get(self.handle.begin_sync.remote())

    def load_bucket(self, handle: dict) -> int:
        return self.finish_load(self.start_load(handle))

    def start_load(self, handle: dict) -> Any:
        return self.handle.load_bucket.remote(handle)

    def finish_load(self, pending: Any) -> int:
        return self._get(pending)

    def end_sync(self, version: int, sent: int) -> int | None:
        return self._get(self.handle.end_sync.remote(version, sent))


def _get(refs: list, names: list[str], timeout_s: float) -> list:
    """``ray.get`` with a deadline; a dead actor or a missed deadline is one clear error."""
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        pending = [n for r, n in zip(refs, names, strict=True) if not ray.wait([r], timeout=0)[0]]
        raise TrainingError(
            f"{', '.join(pending or names)} did not answer within {timeout_s:g} s (a hung call); the last "
            "checkpoint is intact: fix the cause and continue with `pc-megatron train --resume RUN_DIR`"
        ) from None
    except ray.exceptions.RayError as e:
        cause = e
        while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
            cause = cause.cause
        if isinstance(cause, UserError):
            raise cause from None
        detail = str(cause).strip().splitlines()[0][:300] if str(cause).strip() else type(cause).__name__
        who = names[0] if len(names) == 1 else "/".join(names)
        if isinstance(cause, ray.exceptions.RayActorError):
            raise TrainingError(
                f"{who}: a Ray actor died ({detail}); the last checkpoint is intact: continue with "
                "`pc-megatron train --resume RUN_DIR` once the node is healthy"
            ) from None
        raise TrainingError(f"{who} failed: {type(cause).__name__}: {detail}") from None


# ---------------------------------------------------------------------------------- roles
class RayLearnerGroup:
    """The learner ranks; each call runs on every rank and returns rank 0's result."""

    def __init__(self, workers: list, nodes: list[str], model_dir: Path, cfg: Any, seed: int, timeout_s: float):
        import ray

        self.workers, self.nodes, self.timeout_s = workers, nodes, timeout_s
        self.names = [f"learner rank {r} (node {n})" for r, n in enumerate(nodes)]
        master = _get([workers[0].address.remote()], self.names[:1], timeout_s)[0]
        cfg_ref = ray.put(cfg)
        self._version: int | None = self._all([w.setup.remote(master, str(model_dir), cfg_ref, seed) for w in workers])[
            0
        ]

    def _all(self, refs: list) -> list:
        return _get(refs, self.names, self.timeout_s)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        # large arguments (token batches, log-probs) go to the object store once, not once per rank
        args = tuple(ray.put(a) if hasattr(a, "tokens") or hasattr(a, "shape") else a for a in args)
        if method in ("train_rl", "train_sft", "load"):
            self._version = None
        return self._all([w.call.remote(method, *args, **kwargs) for w in self.workers])[0]

    @property
    def version(self) -> int:
        """Rank 0's optimizer-step count (asked once after each call that can change it)."""
        if self._version is None:
            self._version = _get([self.workers[0].version.remote()], self.names[:1], self.timeout_s)[0]
        return self._version

    def logprobs(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("logprobs", *args, **kwargs)

    def train_rl(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return self._call("train_rl", *args, **kwargs)

    def take_pass_stats(self) -> dict[str, dict[str, float]]:
        return self._call("take_pass_stats")  # every rank plans every rank's micro-batches: rank 0 knows all

    def save(self, path: str | Path) -> None:
        self._call("save", str(path))

    def load(self, path: str | Path) -> None:
        self._call("load", str(path))

    def offload(self) -> None:
        self._call("offload")

    def push_weights(self, fleet: RayRolloutFleet, routes: list, bucket_bytes: int, verify: bool) -> dict[str, float]:
        refs = [
            w.push_weights.remote(fleet.engines, fleet.manifest, routes, bucket_bytes, verify, fleet.timeout_s)
            for w in self.workers
        ]
        stats = self._all(refs)[0]
        fleet.weight_version = self.version
        return stats

    def close(self) -> None:
        """Free every rank's sync buffers (shared-memory files, CUDA IPC buffers)."""
        import ray

        ray.get([w.close_senders.remote() for w in self.workers], timeout=60)


def split_by_samples(counts: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous, non-empty prompt ranges, at most ``parts``: the k-th cut is the prompt boundary
    closest to k/parts of the samples."""
    import itertools

    if not counts:
        return []
    prefix = [0, *itertools.accumulate(counts)]
    parts = min(parts, len(counts))
    cuts = [0]
    for k in range(1, parts):
        lo, hi = cuts[-1] + 1, len(counts) - (parts - k)
        target = prefix[-1] * k / parts
        cuts.append(min(range(lo, hi + 1), key=lambda i: (abs(prefix[i] - target), i)))
    cuts.append(len(counts))
    return list(itertools.pairwise(cuts))


class RayRolloutFleet:
    """K engine replicas behind the ``RolloutEngine`` protocol."""

    def __init__(self, engines: list, nodes: list[str], timeout_s: float) -> None:
        self.engines, self.nodes, self.timeout_s = engines, nodes, timeout_s
        self.names = [f"engine replica {i} (node {n})" for i, n in enumerate(nodes)]
        self.manifest = _get([engines[0].manifest.remote()], self.names[:1], timeout_s)[0]
        self.weight_version = 0

    def _all(self, refs: list, names: list[str] | None = None) -> list:
        return _get(refs, names or self.names, self.timeout_s)

    def generate(
        self, prompts: list[list[int]], n: int | list[int], params: SamplingParams, seed: int, first_prompt: int = 0
    ) -> list[Completion]:
        counts = [n] * len(prompts) if isinstance(n, int) else list(n)
        ranges = split_by_samples(counts, len(self.engines))
        refs = [
            e.generate.remote(prompts[a:b], counts[a:b], params, seed, first_prompt + a)
            for e, (a, b) in zip(self.engines, ranges, strict=False)
        ]
        outs = self._all(refs, self.names[: len(refs)])
        completions = []
        for (a, _), out in zip(ranges, outs, strict=True):
            for c in out:
                c.prompt_index += a
            completions.extend(out)
        return completions

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        return self._all([self.engines[0].prompt_logprobs.remote(prompts)], self.names[:1])[0]

    def sleep(self) -> None:
        self._all([e.sleep.remote() for e in self.engines])

    def close(self) -> None:
        import ray

        ray.get([e.close.remote() for e in self.engines], timeout=60)


class RayRuntime:
    def __init__(self, cfg: Any, policy_dir: Path, run_dir: Path) -> None:
        import ray

        rcfg: RayConfig = OmegaConf.to_object(cfg.ray)
        rcfg.validate()
        lc = OmegaConf.to_object(cfg.learner)
        rc = OmegaConf.to_object(cfg.rollout)
        rc.validate()
        world, replicas, tp = lc.world_size, rc.replicas, engine_tp(rc)
        groups = 2 if cfg.algo.loss.kl_coef > 0 else 1  # a reference learner group beside the policy's
        colocated = rcfg.placement == "colocated"
        count = max(world * groups, replicas * tp) if colocated else world * groups + replicas * tp
        start_ray(rcfg, run_dir, count * rcfg.cpus_per_bundle)
        try:
            self._start(cfg, rcfg, lc, rc, policy_dir, run_dir, count, groups)
        except BaseException:
            ray.shutdown()  # no actors or placement groups left behind by a failed start
            raise

    def _start(self, cfg, rcfg, lc, rc, policy_dir: Path, run_dir: Path, count: int, groups: int) -> None:
        import ray

        world, replicas, tp = lc.world_size, rc.replicas, engine_tp(rc)
        colocated = rcfg.placement == "colocated"
        self.bundles = place_bundles(rcfg, count)
        on_gpu = "GPU" in ray.cluster_resources()
        share = 0.5 if colocated else 1.0
        learner_cls = ray.remote(LearnerWorker)
        engine_cls = ray.remote(EngineWorker)

        def learner_group(offset: int) -> RayLearnerGroup:
            bundles = self.bundles[offset : offset + world]
            workers = [
                learner_cls.options(**actor_options(b, rcfg.cpus_per_bundle * share, share if on_gpu else 0)).remote(
                    r, world, cfg.threads
                )
                for r, b in enumerate(bundles)
            ]
            return RayLearnerGroup(workers, [b.node for b in bundles], policy_dir, lc, cfg.seed, rcfg.call_timeout_s)

        first_engine = 0 if colocated else world * groups
        replica_bundles = replica_slices(self.bundles[first_engine:], replicas, tp)
        slot = {id(b): Slot(b.node, i) for i, b in enumerate(self.bundles)}
        self.routes = plan_routes(
            [slot[id(b)] for b in self.bundles[:world]],
            [[slot[id(b)] for b in r] for r in replica_bundles],
            on_gpu=on_gpu,
            placement=rcfg.placement,
            transport=rc.weight_sync.transport,
        )  # before any actor starts: a layout without routes fails here
        self.bucket_bytes, self.verify = rc.weight_sync.bucket_mb << 20, rc.weight_sync.verify
        rc = engine_config(rc, rcfg.placement)
        self.learner = learner_group(0)
        self.ref_learner = learner_group(world) if groups == 2 else None
        engines = []
        for bundles in replica_bundles:
            head = bundles[0]
            if on_gpu and tp > 1:  # vLLM's Ray workers take the GPU shares; the actor only drives them
                opts = actor_options(head, rcfg.cpus_per_bundle * share, 0, capture=True)
                # the engine core in the actor's own process, so that vLLM finds the actor's
                # placement group (a spawned engine-core process is no Ray worker and has none)
                env = {"VLLM_RAY_PER_WORKER_GPUS": str(share), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
                opts["runtime_env"] = {"env_vars": env}
                ray_bundles = [b.index for b in bundles]
            else:
                opts, ray_bundles = actor_options(head, rcfg.cpus_per_bundle * share, share if on_gpu else 0), None
            engines.append(engine_cls.options(**opts).remote(rc, str(policy_dir), lc.bf16, cfg.threads, ray_bundles))
        self.fleet = RayRolloutFleet(engines, [r[0].node for r in replica_bundles], rc.timeout_s)
        placement = {
            "learner": self.learner.nodes,
            "reference_learner": self.ref_learner.nodes if self.ref_learner else [],
            "engines": self.fleet.nodes,
            "placement": rcfg.placement,
            "weight_sync_routes": [r.as_dict() for r in self.routes],
        }
        (run_dir / "placement.json").write_text(json.dumps(placement, indent=2))

    def sync_weights(self) -> dict[str, float]:
        return self.learner.push_weights(self.fleet, self.routes, self.bucket_bytes, self.verify)

    def close(self) -> None:
        import ray

        for part in (self.fleet, self.learner):
            try:
                part.close()
            except Exception:  # the run is ending (often because an actor died): free what is left
                pass
        ray.shutdown()

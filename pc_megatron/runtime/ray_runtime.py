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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pc_megatron.batch import TokenBatch
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.rollout.base import Completion, OnPrompt, stream_by_calls
from pc_megatron.rollout.config import RolloutConfig, SamplingParams
from pc_megatron.runtime.ray_actors import EngineWorker, LearnerWorker, ray_get
from pc_megatron.runtime.ray_cluster import (
    RayConfig,
    actor_options,
    engine_config,
    engine_tp,
    place_bundles,
    replica_slices,
    start_ray,
)
from pc_megatron.runtime.resources import ThreadPlan
from pc_megatron.weight_sync.routes import Slot, match_by_gpu, plan_routes

if TYPE_CHECKING:
    import torch


class RayLearnerGroup:
    """The learner ranks; each call runs on every rank and returns rank 0's result."""

    def __init__(
        self, workers: list, nodes: list[str], model_dir: Path, cfg: LearnerConfig, seed: int, timeout_s: float
    ) -> None:
        import ray

        self.workers, self.nodes, self.timeout_s = workers, nodes, timeout_s
        self.names = [f"learner rank {r} (node {n})" for r, n in enumerate(nodes)]
        master = ray_get([workers[0].address.remote()], self.names[:1], timeout_s)[0]
        cfg_ref = ray.put(cfg)
        self._version: int | None = self._all([w.setup.remote(master, str(model_dir), cfg_ref, seed) for w in workers])[
            0
        ]

    def _all(self, refs: list) -> list:
        return ray_get(refs, self.names, self.timeout_s)

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
            self._version = ray_get([self.workers[0].version.remote()], self.names[:1], self.timeout_s)[0]
        return self._version

    def logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
        return self._call("logprobs", batch, temperature)

    def train_rl(self, *args: Any, **kwargs: Any) -> dict:
        """``Learner.train_rl`` on every rank (its arguments as they are)."""
        return self._call("train_rl", *args, **kwargs)

    def take_pass_stats(self) -> dict[str, dict[str, float]]:
        return self._call("take_pass_stats")  # every rank plans every rank's micro-batches: rank 0 knows all

    def save(self, path: str | Path) -> None:
        self._call("save", str(path))

    def load(self, path: str | Path) -> None:
        self._call("load", str(path))

    def offload(self) -> None:
        self._call("offload")

    def param_dtypes(self) -> dict[str, int]:
        return self._call("param_dtypes")

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
        self.manifest = ray_get([engines[0].manifest.remote()], self.names[:1], timeout_s)[0]
        self.weight_version = 0

    def _all(self, refs: list, names: list[str] | None = None) -> list:
        return ray_get(refs, names or self.names, self.timeout_s)

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

    streams = False  # the replicas' windows are not joined yet: a window is one fleet call

    def generate_stream(
        self, prompts: list[list[int]], n: list[int], params: SamplingParams, seed: int, on_group: OnPrompt
    ) -> list[Completion]:
        return stream_by_calls(self, prompts, n, params, seed, on_group)

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        return self._all([self.engines[0].prompt_logprobs.remote(prompts)], self.names[:1])[0]

    def served_dtype(self) -> str:
        return self._all([self.engines[0].served_dtype.remote()], self.names[:1])[0]

    def sleep(self) -> None:
        self._all([e.sleep.remote() for e in self.engines])

    def close(self) -> None:
        import ray

        ray.get([e.close.remote() for e in self.engines], timeout=60)


class RayRuntime:
    """The learner ranks (and, with ``reference``, a second group holding the initial policy for the
    KL term) and the engine replicas as Ray actors, placed by ``ray``'s settings."""

    def __init__(
        self,
        ray_cfg: RayConfig,
        lc: LearnerConfig,
        rc: RolloutConfig,
        policy_dir: Path,
        run_dir: Path,
        seed: int,
        threads: ThreadPlan,
        reference: bool,
    ) -> None:
        import ray

        rcfg = ray_cfg
        rcfg.validate()
        rc.validate()
        world, replicas, tp = lc.world_size, rc.replicas, engine_tp(rc)
        groups = 2 if reference else 1  # a reference learner group beside the policy's
        colocated = rcfg.placement == "colocated"
        count = max(world * groups, replicas * tp) if colocated else world * groups + replicas * tp
        start_ray(rcfg, run_dir, count * rcfg.cpus_per_bundle)
        try:
            self._start(rcfg, lc, rc, policy_dir, run_dir, count, groups, seed, threads)
        except BaseException:
            ray.shutdown()  # no actors or placement groups left behind by a failed start
            raise

    def _start(
        self,
        rcfg: RayConfig,
        lc: LearnerConfig,
        rc: RolloutConfig,
        policy_dir: Path,
        run_dir: Path,
        count: int,
        groups: int,
        seed: int,
        threads: ThreadPlan,
    ) -> None:
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
                    r, world, threads.learner
                )
                for r, b in enumerate(bundles)
            ]
            return RayLearnerGroup(workers, [b.node for b in bundles], policy_dir, lc, seed, rcfg.call_timeout_s)

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
        per_replica = len(threads.engine_cores) // replicas  # disjoint core slices on a CPU node
        for i, bundles in enumerate(replica_bundles):
            cores = threads.engine_cores[i * per_replica : (i + 1) * per_replica]
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
            engines.append(
                engine_cls.options(**opts).remote(rc, str(policy_dir), lc.bf16, threads.engine, ray_bundles, cores)
            )
        self.fleet = RayRolloutFleet(engines, [r[0].node for r in replica_bundles], rc.timeout_s)
        learner_gpus: list[str] = []
        if on_gpu and any(r.transport == "cuda_ipc" for r in self.routes):  # by physical GPU, not bundle index
            learners = self.learner.workers
            learner_gpus = ray_get([w.gpu_id.remote() for w in learners], self.learner.names, rcfg.call_timeout_s)
            worker_gpus = ray_get([e.gpu_ids.remote() for e in engines], self.fleet.names, rc.timeout_s)
            self.routes = match_by_gpu(self.routes, learner_gpus, worker_gpus)
        placement = {
            "learner": self.learner.nodes,
            "learner_gpus": learner_gpus,  # rank r's GPU (its UUID) where CUDA IPC routes were matched
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

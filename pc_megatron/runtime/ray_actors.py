"""The Ray actors of ``runtime=ray``: one learner rank (``LearnerWorker``) and one engine replica
(``EngineWorker``), and ``ray_get``, every driver-side wait with its deadline. The driver-side roles
that fan calls out to them are in ``ray_runtime.py``."""

from __future__ import annotations

import os
import socket
from typing import Any

from pc_megatron.errors import TrainingError, UserError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.rollout.base import Completion
from pc_megatron.rollout.config import RolloutConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class LearnerWorker:
    """One learner rank (a Ray actor)."""

    def __init__(self, rank: int, world: int, threads: int) -> None:
        import torch

        self.rank, self.world = rank, world
        torch.set_num_threads(threads)
        self.learner = None
        self._group: tuple[list, Any] | None = None  # rank 0: (engines, BroadcastGroup) of the broadcast transport
        self._senders: dict[str, Any] | None = None  # this rank's senders of routed syncs, by transport

    def gpu_id(self) -> str:
        """The physical GPU this rank trains on (its UUID), '' on CPU."""
        import torch

        from pc_megatron.weight_sync.buckets import gpu_uuid

        return gpu_uuid(torch.device("cuda", torch.cuda.current_device())) if torch.cuda.is_available() else ""

    def address(self) -> tuple[str, int]:
        return _node_ip(), _free_port()

    def setup(self, master: tuple[str, int], model_dir: str, cfg: LearnerConfig, seed: int) -> int:
        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",  # Ray shows each actor only its own GPU
        )
        from pc_megatron.learner.learner import Learner

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
        counts = ray_get([e.sync_ranks.remote() for e in engines], names, timeout_s)
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
                ray_get([ref], [names[refs.index(ref)]], timeout_s)

        try:
            group.connect(rank_names, poll)
            ray_get(refs, names, timeout_s)
        except BaseException:
            group.close()
            raise
        self._group = (list(engines), group)
        return group


class EngineWorker:
    """One engine replica (a Ray actor) holding an hf or vllm engine."""

    def __init__(
        self,
        rollout_cfg: RolloutConfig,
        model_dir: str,
        learner_bf16: bool,
        threads: int,
        ray_bundles: list[int] | None,
        cpu_cores: tuple[int, ...] = (),
    ) -> None:
        import torch

        from pc_megatron.rollout.engines import build_engine

        torch.set_num_threads(threads)
        self.engine = build_engine(
            rollout_cfg, model_dir, learner_bf16=learner_bf16, ray_bundles=ray_bundles, cpu_cores=cpu_cores
        )

    def served_dtype(self) -> str:
        return self.engine.served_dtype()

    def manifest(self) -> Any:
        return self.engine.manifest

    def generate(self, *args: Any, **kwargs: Any) -> list[Completion]:
        return self.engine.generate(*args, **kwargs)

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        return self.engine.prompt_logprobs(prompts)

    def begin_sync(self) -> None:
        self.engine.begin_sync()

    def gpu_ids(self) -> list[str]:
        """The physical GPU of each of the engine's workers, in worker order."""
        return self.engine.gpu_ids()

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
        return ray_get([ref], [f"engine replica {self.index}"], self.timeout_s)[0]

    def start(self, method: str, *args) -> Any:
        """A call started on the replica's actor, waited for by ``finish`` (``routed.call_each``)."""
        return getattr(self.handle, method).remote(*args)

    def finish(self, pending: Any) -> Any:
        return self._get(pending)

    def begin_sync(self) -> None:
        self.finish(self.start("begin_sync"))

    def load_bucket(self, handle: dict) -> int:
        return self.finish(self.start("load_bucket", handle))

    def start_load(self, handle: dict) -> Any:  # a collective sender's target (transport.push_weights)
        return self.start("load_bucket", handle)

    def finish_load(self, pending: Any) -> int:
        return self.finish(pending)

    def end_sync(self, version: int, sent: int) -> int | None:
        return self.finish(self.start("end_sync", version, sent))


def ray_get(refs: list, names: list[str], timeout_s: float) -> list:
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

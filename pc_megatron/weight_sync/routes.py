"""Who sends the learner's weights to which engine worker, over what: a pure function of the layout.

Every learner rank holds every full HF tensor while the export walks the model (each is gathered
over its tensor-parallel group and broadcast from the stage that owns it), so any rank can send.
The route of an engine worker (one GPU of one engine replica) follows its placement:

- **colocated** (learner rank i and engine worker i share bundle i, one GPU): the worker receives
  from the learner rank on its own GPU: ``cuda_ipc`` on GPU (a device-to-device copy inside one
  GPU), ``shm`` on CPU (the same node). On GPU a worker whose bundle holds no learner rank has no
  such sender: that layout is refused (give the learner at least as many ranks as engine workers,
  or use ``split``); on CPU rank 0 sends to it.
- **split** (engines on GPUs of their own): from learner rank 0; on GPU by ``broadcast`` (NCCL;
  CUDA IPC would cross GPUs), on CPU by ``shm`` on rank 0's node and ``bytes`` (Ray's object store)
  elsewhere. ``broadcast`` always sends from rank 0.
- ``runtime=local``: one learner rank and one engine in one process (``local`` for the hf engine,
  which copies the tensors; ``shm`` / ``cuda_ipc`` into vLLM's worker processes).

An explicit ``rollout.weight_sync.transport`` is honoured where it can work and refused, with the
reason, where it cannot (``cuda_ipc`` between two GPUs or from CPU, ``shm`` across nodes,
``broadcast`` between colocated processes on one GPU). An engine replica's workers never span
nodes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pc_megatron.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    """One bundle: a GPU (or a CPU share) on a node. ``index`` is its place in the run's ordered
    bundle list (learner rank i takes slot i; colocated engines share the learner's slots)."""

    node: str
    index: int


@dataclass(frozen=True)
class Route:
    replica: int
    worker: int  # the worker's rank inside its replica (vLLM's tensor-parallel rank)
    slot: Slot  # where the worker runs
    sender: int  # learner rank
    transport: str  # local | shm | cuda_ipc | bytes | broadcast
    gpu: str = ""  # the physical GPU both ends report (``match_by_gpu``); "" until matched

    def as_dict(self) -> dict:
        """What ``placement.json`` records of the route."""
        out = {
            "replica": self.replica,
            "worker": self.worker,
            "node": self.slot.node,
            "bundle": self.slot.index,
            "sender": self.sender,
            "transport": self.transport,
        }
        return {**out, "gpu": self.gpu} if self.gpu else out

    def describe(self) -> str:
        on = f", GPU {self.gpu}" if self.gpu else ""
        return (
            f"engine replica {self.replica} worker {self.worker} (node {self.slot.node}, bundle {self.slot.index}{on}) "
            f"<- learner rank {self.sender} by {self.transport}"
        )


def plan_routes(
    learner: list[Slot],
    replicas: list[list[Slot]],
    *,
    on_gpu: bool,
    placement: str,
    transport: str = "auto",
    runtime: str = "ray",
    engine: str = "vllm",
) -> list[Route]:
    """One ``Route`` per engine worker, replica by replica. ``learner[r]`` is rank r's slot;
    ``replicas[k][w]`` worker w of replica k."""
    for k, workers in enumerate(replicas):
        nodes = sorted({s.node for s in workers})
        if len(nodes) > 1:
            raise ConfigError(
                f"engine replica {k} ({len(workers)} workers) would span nodes {nodes}: make ray.bundles_per_node a "
                "multiple of rollout.vllm.tensor_parallel_size (and of the learner's ranks per node)"
            )
    if runtime == "local":
        kind = transport if transport != "auto" else ("local" if engine == "hf" else "cuda_ipc" if on_gpu else "shm")
        if kind == "broadcast":
            raise ConfigError("rollout.weight_sync.transport=broadcast needs runtime=ray (one process has no peer)")
        if kind == "cuda_ipc" and not on_gpu:
            raise ConfigError("rollout.weight_sync.transport=cuda_ipc needs a GPU; use shm (or auto) on CPU")
        if kind == "cuda_ipc" and len(replicas[0]) > 1:
            raise ConfigError(
                f"runtime=local with an engine of {len(replicas[0])} GPUs (rollout.vllm.tensor_parallel_size): the "
                "learner's CUDA IPC buffer is on one GPU and each engine worker must read its shard on its own; "
                "use runtime=ray (ray.placement=colocated puts a learner rank on each engine worker's GPU; split "
                "broadcasts to them), or rollout.vllm.tensor_parallel_size=1"
            )
        return [Route(0, 0, replicas[0][0], 0, kind)]
    by_slot = {s.index: rank for rank, s in enumerate(learner)}
    routes = []
    for k, workers in enumerate(replicas):
        for w, slot in enumerate(workers):
            routes.append(_route(k, w, slot, learner, by_slot, on_gpu, placement, transport))
    return routes


def match_by_gpu(routes: list[Route], learner_gpus: list[str], worker_gpus: list[list[str]]) -> list[Route]:
    """CUDA IPC routes re-pointed at the learner rank on the same physical GPU, by the identity both
    report (``gpu_uuid``), not by bundle index: vLLM's Ray executor puts worker w of a replica on the
    w-th smallest GPU id of the replica's bundles, and Ray does not promise ascending GPU ids along
    bundle indices. ``worker_gpus[k][w]``: replica k's worker w. A worker on no learner rank's GPU is
    one ConfigError naming it."""
    out = []
    for r in routes:
        if r.transport != "cuda_ipc":
            out.append(r)
            continue
        gpu = worker_gpus[r.replica][r.worker]
        senders = [rank for rank, g in enumerate(learner_gpus) if g == gpu]
        if not senders:
            raise ConfigError(
                f"engine replica {r.replica} worker {r.worker} runs on GPU {gpu}, where no learner rank runs (learner "
                f"GPUs: {learner_gpus}); CUDA IPC copies within one GPU: give every engine worker a learner rank on "
                "its GPU (ray.placement=colocated with as many learner ranks as engine workers), or use broadcast"
            )
        out.append(dataclasses.replace(r, sender=senders[0], gpu=gpu))
    return out


def _route(k, w, slot: Slot, learner: list[Slot], by_slot: dict[int, int], on_gpu, placement, transport) -> Route:
    where = f"engine replica {k} worker {w} (node {slot.node})"
    colocated = placement == "colocated"
    sender = by_slot.get(slot.index) if colocated and transport != "broadcast" else 0
    if sender is None:
        if on_gpu:
            raise ConfigError(
                f"{where} shares bundle {slot.index} with no learner rank, and a colocated engine worker receives "
                f"from the learner rank on its own GPU: give the learner at least as many ranks as engine workers "
                f"({len(learner)} < rollout.replicas x rollout.vllm.tensor_parallel_size), or set ray.placement=split"
            )
        sender = 0  # CPU: no GPU to share; rank 0 sends (shm on its node)
    same_node = learner[sender].node == slot.node
    kind = transport
    if kind == "auto":
        if on_gpu:
            kind = "cuda_ipc" if colocated else "broadcast"
        else:
            kind = "shm" if same_node else "bytes"
    if kind == "cuda_ipc" and not on_gpu:
        raise ConfigError("rollout.weight_sync.transport=cuda_ipc needs a GPU; use shm (or auto) on CPU")
    if kind == "cuda_ipc" and not colocated:
        raise ConfigError(
            f"{where}: cuda_ipc copies within one GPU, and with ray.placement=split the engine has a GPU of its own: "
            "use broadcast (or auto)"
        )
    if kind == "shm" and not same_node:
        raise ConfigError(
            f"{where}: shared memory does not cross nodes (learner rank {sender} is on {learner[sender].node}): use "
            "bytes or broadcast (or auto)"
        )
    if kind == "broadcast" and on_gpu and colocated:
        raise ConfigError(
            "rollout.weight_sync.transport=broadcast on GPU needs ray.placement=split: NCCL takes one process per GPU, "
            "and colocated engines share the learner's GPUs (use auto or cuda_ipc)"
        )
    return Route(k, w, slot, sender, kind)


def layout_slots(
    world: int, replicas: int, engine_tp: int, placement: str, per_node: int, learner_groups: int = 1
) -> tuple[list[Slot], list[list[Slot]]]:
    """The slots ``runtime=ray`` gives a layout on nodes of ``per_node`` bundles (the learner's
    ``world`` ranks first, a reference learner's after them, then, with ``split``, the engines;
    ``colocated`` engines share the learner's bundles from the first): what ``pc-megatron plan``
    shows before a cluster exists. Nodes are named ``node0``, ``node1``, ..."""
    learners = world * learner_groups
    engines = replicas * engine_tp
    count = max(learners, engines) if placement == "colocated" else learners + engines
    slots = [Slot(f"node{i // per_node}", i) for i in range(count)]
    first = 0 if placement == "colocated" else learners
    return slots[:world], [slots[first + k * engine_tp : first + (k + 1) * engine_tp] for k in range(replicas)]

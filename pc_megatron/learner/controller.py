"""One controller over a multi-process learner.

Under ``torchrun`` the RL loop (scheduler, rollout engine, rewards, evaluation, checkpoint
bookkeeping) runs on global rank 0 only; every rank holds its part of the learner (its TP shard
of its pipeline stage of its data-parallel replica). Rank 0 talks to its learners through
``LearnerHandle``: each call to a learner method that runs collectives is first broadcast to
the other ranks, which make the same call on their own ``Learner``, so the collectives line
up. The other ranks run ``serve()`` until rank 0 sends ``stop``.

Arguments travel by ``broadcast_object_list`` (pickled): a token batch per call, which is
small next to the step's compute. Paths must name the same files on every rank (one node, or
a shared file system across nodes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner

# Learner methods that run collectives: every rank must make the call.
COLLECTIVE = frozenset(
    {
        "logprobs",
        "forward_logits",
        "train_rl",
        "train_sft",
        "full_named_parameters",
        "hf_named_tensors",
        "save",
        "load",
        "offload",
        "onload",
    }
)
_ids = itertools.count()


def multi_process() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _send(message: tuple) -> None:
    dist.broadcast_object_list([message], src=0)


def _receive() -> tuple:
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class LearnerHandle:
    """Rank 0's learner: a local ``Learner`` whose collective methods are mirrored on every rank."""

    def __init__(self, model_dir: str | Path, cfg: LearnerConfig, seed: int) -> None:
        self._id = next(_ids)
        _send(("new", self._id, (str(model_dir), cfg, seed), {}))
        self._local = Learner(model_dir, cfg, seed)

    def __getattr__(self, name: str):
        attr = getattr(self._local, name)
        if name not in COLLECTIVE:
            return attr

        def mirrored(*args, **kwargs):
            _send((name, self._id, args, kwargs))
            return attr(*args, **kwargs)

        return mirrored


def make_learner(model_dir: str | Path, cfg: LearnerConfig, seed: int) -> Learner | LearnerHandle:
    """A ``Learner`` in a one-process run; on rank 0 of a multi-process run, a handle whose
    collective calls the other ranks (in ``serve``) repeat."""
    return LearnerHandle(model_dir, cfg, seed) if multi_process() else Learner(model_dir, cfg, seed)


def stop_serving() -> None:
    if multi_process() and dist.get_rank() == 0:
        _send(("stop", -1, (), {}))


def serve() -> None:
    """Ranks other than 0: repeat rank 0's learner calls until it sends ``stop``. An error in a
    call is raised here too (rank 0 meets the same one: the calls and their data are the same)."""
    learners: dict[int, Learner] = {}
    while True:
        op, learner_id, args, kwargs = _receive()
        if op == "stop":
            return
        if op == "new":
            learners[learner_id] = Learner(*args, **kwargs)
            continue
        out = getattr(learners[learner_id], op)(*args, **kwargs)
        if isinstance(out, Iterator):  # weight export: take part in every gather
            for _ in out:
                pass

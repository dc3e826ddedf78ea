"""The ``broadcast`` weight-sync transport over gloo: the sender in this process, the receivers
in spawned processes (each its own torch runtime, as engine processes are), driven by
``push_weights`` through a small queue-based call channel standing in for Ray or vLLM's RPC."""

from __future__ import annotations

import queue
import time

import pytest
import torch
import torch.multiprocessing as mp

from pc_megatron.errors import TrainingError
from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
from pc_megatron.weight_sync.buckets import buckets
from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError
from pc_megatron.weight_sync.transport import BroadcastSender, push_weights

BUCKET = 64 << 10


def _engine_process(requests, answers, out_path: str, device: str) -> None:
    """A receiving engine process: stages what a sync delivers and saves it at a successful end."""
    from pc_megatron.weight_sync.receiver import BucketReceiver

    torch.set_num_threads(1)
    receiver, staged = BucketReceiver(device), {}
    while True:
        call, *args = requests.get()
        try:
            if call == "stop":
                receiver.leave()
                return
            if call == "join":
                answer = receiver.join(*args)
            elif call == "begin":
                staged, answer = {}, None
            elif call == "load":
                tensors = receiver.open(args[0])
                staged.update(tensors)
                answer = len(tensors)
            else:  # "end"
                version, sent = args
                receiver.close()
                answer = version if version >= 0 and len(staged) == sent else None
                if answer is not None:
                    torch.save({n: t.cpu() for n, t in staged.items()}, out_path)
        except Exception as e:
            answer = RuntimeError(f"{type(e).__name__}: {e}")
        answers.put(answer)


class _Engine:
    """A receiver process as a ``CollectiveSyncTarget``: a call is a message, its answer comes back."""

    def __init__(self, ctx, out_path, device: str = "cpu") -> None:
        self.requests, self.answers, self.out_path = ctx.Queue(), ctx.Queue(), out_path
        args = (self.requests, self.answers, str(out_path), device)
        self.proc = ctx.Process(target=_engine_process, args=args, daemon=True)
        self.proc.start()

    def answer(self, timeout: float = 120):
        got = self.answers.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise got
        return got

    def start_join(self, info: dict, rank: int) -> None:
        self.requests.put(("join", info, rank))

    def begin_sync(self) -> None:
        self.requests.put(("begin",))
        self.answer()

    def start_load(self, handle: dict) -> None:
        self.requests.put(("load", handle))

    def finish_load(self, pending: None) -> int:
        return self.answer()

    def load_bucket(self, handle: dict) -> int:
        return self.finish_load(self.start_load(handle))

    def end_sync(self, version: int, sent: int) -> int | None:
        self.requests.put(("end", version, sent))
        return self.answer()

    def stop(self) -> None:
        if self.proc.is_alive():
            self.requests.put(("stop",))
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    named = {
        "big.weight": torch.randn(200, 300, generator=g),  # 240 KB: larger than a bucket, sent alone
        "embed.weight": torch.randn(64, 96, generator=g).to(torch.bfloat16),
        "ids": torch.randint(-(2**40), 2**40, (500,), generator=g),
        "bias": torch.randn(7, generator=g),  # an unaligned size: the next tensor's offset is padded
    }
    for i in range(12):
        named[f"layers.{i}.weight"] = torch.randn(48, 64, generator=g)
    return named


def test_buckets_broadcast_bit_identical_into_every_receiver_and_the_group_is_reused(tmp_path):
    ctx = mp.get_context("spawn")
    engines = [_Engine(ctx, tmp_path / f"engine{i}.pt") for i in range(2)]
    try:
        group = BroadcastGroup.create("127.0.0.1", receivers=2, timeout_s=60)
        for rank, engine in enumerate(engines, start=1):
            engine.start_join(group.info, rank)
        group.connect()
        assert [e.answer() for e in engines] == [group.key] * 2
        sender = BroadcastSender(BUCKET, group)

        for version in (1, 2):  # the second sync reuses the group (the receivers' buffers are new)
            named = _weights(seed=version)
            manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in named.items()})
            assert len(list(buckets(named.items(), BUCKET))) >= 4
            stats = push_weights(named.items(), manifest, sender, engines, version)
            assert stats["weight_sync_bytes"] == sum(t.numel() * t.element_size() for t in named.values())
            assert stats["weight_sync_gbps"] > 0
            for engine in engines:
                got = torch.load(engine.out_path)
                assert got.keys() == named.keys()
                for name, t in named.items():
                    assert got[name].dtype == t.dtype and torch.equal(got[name], t), name

        # a stream the manifest refuses: every receiver closes the sync without a model, the
        # group stays up (nothing was in flight) and the next sync goes through it
        named = _weights(seed=3)
        manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in named.items()})
        named["layers.5.weight"] = torch.zeros(3)
        with pytest.raises(WeightSyncError, match="layers.5.weight"):
            push_weights(named.items(), manifest, sender, engines, 3)
        assert group.alive
        named = _weights(seed=4)
        push_weights(named.items(), manifest, sender, engines, 4)
        assert torch.equal(torch.load(engines[1].out_path)["big.weight"], named["big.weight"])
        sender.close()
        group.close()
    finally:
        for engine in engines:
            engine.stop()


def test_a_receiver_that_never_joins_is_one_clear_error_at_the_deadline(tmp_path):
    ctx = mp.get_context("spawn")
    engine = _Engine(ctx, tmp_path / "engine.pt")
    try:
        group = BroadcastGroup.create("127.0.0.1", receivers=2, timeout_s=3)
        engine.start_join(group.info, 1)  # rank 2 never comes
        t0 = time.monotonic()
        with pytest.raises(TrainingError, match=r"engine replica 1 did not join the group within 3 s"):
            group.connect(names=["engine replica 0", "engine replica 1"])
        assert time.monotonic() - t0 < 10
        assert not group.alive
        # the receiver that came is not left waiting for the group either
        with pytest.raises(RuntimeError):
            engine.answer(timeout=60)
    except queue.Empty:
        pytest.fail("the receiver that joined kept waiting for the group that never formed")
    finally:
        engine.stop()

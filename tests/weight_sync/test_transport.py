"""The ``broadcast`` weight-sync transport (``pc_megatron/weight_sync/transport.py``) over gloo: the sender in
this process, the receivers in spawned processes (each its own torch runtime, as engine processes are),
driven by ``push_weights`` through a small queue-based call channel standing in for Ray or vLLM's RPC
(``broadcast_receivers.py``). Marked ``gpu`` (skipped on CPU): the same over NCCL into another GPU."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from pc_megatron.weight_sync.broadcast_group import BroadcastGroup
from pc_megatron.weight_sync.buckets import buckets
from pc_megatron.weight_sync.manifest import Manifest, WeightSyncError
from pc_megatron.weight_sync.transport import BroadcastSender, push_weights
from tests.weight_sync.broadcast_receivers import BUCKET, ReceiverEngine, sample_weights


def test_buckets_broadcast_bit_identical_into_every_receiver_and_the_group_is_reused(tmp_path):
    ctx = mp.get_context("spawn")
    engines = [ReceiverEngine(ctx, tmp_path / f"engine{i}.pt") for i in range(2)]
    try:
        group = BroadcastGroup.create("127.0.0.1", receivers=2, timeout_s=60)
        for rank, engine in enumerate(engines, start=1):
            engine.start_join(group.info, rank)
        group.connect()
        assert [e.answer() for e in engines] == [group.key] * 2
        sender = BroadcastSender(BUCKET, group)

        for version in (1, 2):  # the second sync reuses the group (the receivers' buffers are new)
            named = sample_weights(seed=version)
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
        named = sample_weights(seed=3)
        manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in named.items()})
        named["layers.5.weight"] = torch.zeros(3)
        with pytest.raises(WeightSyncError, match="layers.5.weight"):
            push_weights(named.items(), manifest, sender, engines, 3)
        assert group.alive
        named = sample_weights(seed=4)
        push_weights(named.items(), manifest, sender, engines, 4)
        assert torch.equal(torch.load(engines[1].out_path)["big.weight"], named["big.weight"])
        sender.close()
        group.close()
    finally:
        for engine in engines:
            engine.stop()


@pytest.mark.gpu
def test_broadcast_weight_sync_over_nccl_into_another_gpu(tmp_path):
    """The broadcast transport on GPU: the sender on cuda:0 (this process), a receiver process on
    cuda:1; every bucket is one NCCL broadcast between device buffers, bit-identical on arrival."""
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL takes one process per GPU: needs 2 GPUs")

    engine = ReceiverEngine(mp.get_context("spawn"), tmp_path / "engine.pt", device="cuda:1")
    try:
        torch.cuda.set_device(0)
        group = BroadcastGroup.create("127.0.0.1", receivers=1, timeout_s=120, device="cuda:0")
        assert group.info["backend"] == "nccl"
        engine.start_join(group.info, 1)
        group.connect()
        assert engine.answer() == group.key
        sender = BroadcastSender(BUCKET, group)
        for version in (1, 2):
            named = {n: t.cuda() for n, t in sample_weights(seed=version).items()}
            manifest = Manifest({n: (tuple(t.shape), t.dtype) for n, t in named.items()})
            stats = push_weights(named.items(), manifest, sender, [engine], version)
            assert stats["weight_sync_gbps"] > 0 and sender.buffer.device.type == "cuda"
            got = torch.load(engine.out_path)
            for name, t in named.items():
                assert torch.equal(got[name], t.cpu()), name
        sender.close()
        group.close()
    finally:
        engine.stop()

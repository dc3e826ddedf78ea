"""A reused sync buffer against a receiver in another process (``pc_megatron/weight_sync/receiver.py``): the
receiver copies out (and, on GPU, synchronises) before its load call answers, so a slow copy-out still
gets every bucket intact; a receiver that answered first and copied later would read the next bucket,
and the checksum says so.

The shm transport runs here; the CUDA IPC one is the same test, marked ``gpu``."""

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest
import torch

from pc_megatron.weight_sync.buckets import checksum, unpack
from pc_megatron.weight_sync.receiver import BucketReceiver
from pc_megatron.weight_sync.transport import make_sender

DELAY_S = 0.3


def _buckets() -> list[list[tuple[str, torch.Tensor]]]:
    """Three buckets of the same layout (so the sender refills one buffer) with different contents."""
    g = torch.Generator().manual_seed(0)
    return [[("w", torch.randn(64, 32, generator=g)), ("b", torch.randn(32, generator=g))] for _ in range(3)]


def _receiver(conn, mode: str, device: str) -> None:
    """Per handle: ``copy``: sleep, copy out, answer; ``deferred``: answer, sleep, then read the
    buffer (what an unsynchronised copy-out amounts to). Reports whether each bucket matched. GPU 0
    is the current device, whatever ``device`` is."""
    if device.startswith("cuda"):
        torch.cuda.set_device(0)
    rx = BucketReceiver(device)
    results = []
    while (handle := conn.recv()) is not None:
        if mode == "copy":
            time.sleep(DELAY_S)
            tensors = rx.open(handle)  # checks the checksum itself
            conn.send("loaded")
            results.append(True)
        else:
            views = _deferred_views(rx, handle)
            conn.send("loaded")
            time.sleep(DELAY_S)  # the sender refills the buffer meanwhile
            tensors = [(n, t.clone()) for n, t in views]
            results.append(checksum(tensors) == handle["checksum"])
        results[-1] = results[-1] and all(torch.isfinite(t).all() for _, t in tensors)
    conn.send(results)


def _deferred_views(rx: BucketReceiver, handle: dict):
    from pc_megatron.weight_sync.buckets import TensorMeta
    from pc_megatron.weight_sync.receiver import open_ipc_buffer

    metas = [TensorMeta(n, d, tuple(s), o, b) for n, d, s, o, b in handle["metas"]]
    if handle["kind"] == "shm":
        buffer = torch.from_file(handle["path"], shared=True, size=handle["size"], dtype=torch.uint8)
    else:
        buffer = open_ipc_buffer(handle)
    return unpack(buffer, metas, copy=False)


def _run(kind: str, mode: str, device: str) -> list[bool]:
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(theirs, mode, device))
    proc.start()
    sender = make_sender(kind, 1 << 20, verify=True)
    try:
        for bucket in _buckets():
            handle = sender.pack([(n, t.to(device)) for n, t in bucket])
            mine.send(handle)
            assert mine.recv() == "loaded"  # the load call answered: the sender may refill now
        mine.send(None)
        return mine.recv()
    finally:
        proc.join(timeout=30)
        sender.close()


def test_shm_receiver_that_copies_before_answering_gets_every_bucket_intact():
    assert _run("shm", "copy", "cpu") == [True, True, True]


def test_negative_control_a_receiver_that_answers_before_copying_reads_the_next_bucket():
    """The checksum catches what the protocol prevents: the deferred reads of the first two buckets
    see the next bucket's bytes (the last one has no successor to overwrite it)."""
    assert _run("shm", "deferred", "cpu") == [False, False, True]


@pytest.mark.gpu
def test_cuda_ipc_receiver_that_copies_before_answering_gets_every_bucket_intact():
    assert _run("cuda_ipc", "copy", "cuda:0") == [True, True, True]


@pytest.mark.gpu
def test_cuda_ipc_receiver_opens_the_buffer_on_its_own_gpu_not_its_threads_current_one():
    """The sender's buffer on GPU 1; the receiver's thread has GPU 0 current (as in a thread vLLM did
    not set up) and its own device is GPU 1: it opens the buffer there, every bucket intact. (Its
    wait for the copies is on GPU 1 too; the checksum here would hide a wait on the wrong GPU, since
    reading it waits for GPU 1.)"""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the receiver's device and another current one")
    with torch.cuda.device(1):
        assert _run("cuda_ipc", "copy", "cuda:1") == [True, True, True]


@pytest.mark.gpu
def test_cuda_ipc_works_under_an_inherited_expandable_segments_setting(monkeypatch):
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (a common inherited setting): the IPC buffer is
    still an ordinary allocation, which another process opens without extra privileges; the setting
    is back on after it."""
    from pc_megatron.weight_sync.transport import ipc_buffer

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        assert _run("cuda_ipc", "copy", "cuda:0") == [True, True, True]
        assert ipc_buffer(1 << 20, torch.device("cuda", 0)).numel() == 1 << 20
    finally:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


@pytest.mark.gpu
def test_cuda_ipc_negative_control_deferred_reads_see_the_next_bucket():
    assert _run("cuda_ipc", "deferred", "cuda:0") == [False, False, True]


def test_a_damaged_bucket_is_refused_on_arrival():
    """``verify``: the receiver compares its copies with the sender's checksum."""
    from pc_megatron.weight_sync.manifest import WeightSyncError

    sender = make_sender("bytes", 1 << 20, verify=True)
    handle = sender.pack(_buckets()[0])
    BucketReceiver().open(handle)  # intact
    data = bytearray(handle["data"])
    data[100] ^= 0xFF
    with pytest.raises(WeightSyncError, match="arrived damaged"):
        BucketReceiver().open({**handle, "data": bytes(data)})


def test_a_shared_memory_file_removed_under_the_sync_is_refused_not_read_as_zeros():
    """A /dev/shm cleaner (or logind's RemoveIPC) removing the sender's file: the receiver says so instead
    of mapping a fresh file of zeros and serving them under the new version."""
    from pathlib import Path

    from pc_megatron.weight_sync.manifest import WeightSyncError

    sender = make_sender("shm", 1 << 16)
    try:
        handle = sender.pack([("w", torch.ones(8, 8))])
        Path(handle["path"]).unlink()
        with pytest.raises(WeightSyncError, match=r"shared-memory file .* is gone .*RemoveIPC"):
            BucketReceiver("cpu").open(handle)
        assert not Path(handle["path"]).exists()  # and it made none
    finally:
        sender.close()


def test_a_too_small_dev_shm_is_one_clear_error_not_a_sigbus(monkeypatch):
    from collections import namedtuple

    from pc_megatron.weight_sync import transport
    from pc_megatron.weight_sync.manifest import WeightSyncError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(transport.shutil, "disk_usage", lambda path: usage(64 << 20, 60 << 20, 4 << 20))
    sender = make_sender("shm", 512 << 20)
    with pytest.raises(WeightSyncError, match=r"has 4 MiB free, a weight-sync bucket needs 512 MiB.*shm-size"):
        sender.pack([("w", torch.ones(4))])


def test_buffers_a_killed_sender_left_in_dev_shm_are_swept_and_no_live_ones(tmp_path, monkeypatch):
    """A SIGKILLed run cannot remove its bucket file; the next sender does, and only files of this
    user and PID namespace whose process is gone (a live sender's, or another container's, stay)."""
    import subprocess
    import sys

    from pc_megatron.weight_sync import transport

    monkeypatch.setattr(transport, "SHM_DIR", tmp_path)
    ns = transport._pid_namespace()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    dead = tmp_path / f"pcm-sync-{ns}-{dead_pid}-0123456789ab"
    live = tmp_path / f"pcm-sync-{ns}-{os.getpid()}-0123456789ab"
    elsewhere = tmp_path / f"pcm-sync-{ns + 1}-{dead_pid}-0123456789ab"  # another container's numbering
    other = tmp_path / "pcm-sync-notours"
    for f in (dead, live, elsewhere, other):
        f.write_bytes(b"x")
    sender = make_sender("shm", 1 << 16)
    try:
        handle = sender.pack([("w", torch.ones(4))])
        assert not dead.exists() and live.exists() and elsewhere.exists() and other.exists()
        assert Path(handle["path"]).parent == tmp_path and Path(handle["path"]).name.startswith(f"pcm-sync-{ns}-")
    finally:
        sender.close()

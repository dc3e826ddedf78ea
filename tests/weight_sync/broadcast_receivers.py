"""Receiving engine processes for the broadcast transport's tests: each a spawned process with its own
torch runtime, driven through a small queue-based call channel standing in for Ray or vLLM's RPC."""

from __future__ import annotations

import torch

BUCKET = 64 << 10


def engine_process(requests, answers, out_path: str, device: str) -> None:
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


class ReceiverEngine:
    """A receiver process as a ``CollectiveSyncTarget``: a call is a message, its answer comes back."""

    def __init__(self, ctx, out_path, device: str = "cpu") -> None:
        self.requests, self.answers, self.out_path = ctx.Queue(), ctx.Queue(), out_path
        args = (self.requests, self.answers, str(out_path), device)
        self.proc = ctx.Process(target=engine_process, args=args, daemon=True)
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


def sample_weights(seed: int) -> dict[str, torch.Tensor]:
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

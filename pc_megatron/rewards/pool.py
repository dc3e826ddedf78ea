"""The reward role: scores completions in worker processes, each completion with its own deadline.

A reward may hang (a parser on an adversarial expression: math-verify's own alarm works only on a
main thread) or crash the interpreter. Neither may stall or kill the run, and neither may pass
silently. So each worker is a separate Python process (``python -m pc_megatron.rewards.pool``,
started fresh, so it does not re-import the driver's modules), fed chunks of items over a socket
pair and answering item by item. A worker whose current item runs past ``reward.timeout_s`` is
killed and replaced; that item scores ``reward.failure_score`` (by default the reward's score
for a wrong answer) and counts as a timeout; the rest of its chunk goes back in the queue. A
worker that dies counts its item as an error the same way. A reward that raises stops the step
with the prompt id and input (``reward.on_error=raise``) or is counted (``count``). When more
than ``reward.max_failure_frac`` of a call fails, the reward is broken rather than the inputs
hard, and the run stops with a clear error.

Workers end with the driver: their socket closes and they exit.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait

from pc_megatron.errors import RewardError
from pc_megatron.lifetime import die_with_parent, spawn
from pc_megatron.rewards import RewardResult, build_reward
from pc_megatron.rewards.config import RewardConfig

_MIN_FAILURES = 8  # below this many failures a call is never called broken
_START_S = 60.0  # a worker that is not ready after this long (importing the reward) is an error


@dataclasses.dataclass
class Scored:
    """One call's results in input order, and what went wrong on the way."""

    results: list[RewardResult]
    timeouts: int = 0
    errors: int = 0
    seconds: float = 0.0
    failed: dict[int, str] = dataclasses.field(default_factory=dict)  # index -> "timeout" / "error"


class _Worker:
    def __init__(self, cfg: RewardConfig) -> None:
        ours, theirs = socket.socketpair()
        self.proc = spawn(  # from a thread that outlives every caller's: the worker dies with the process only
            [sys.executable, "-m", "pc_megatron.rewards.pool", str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((dataclasses.asdict(cfg), list(sys.path)))
        self.ready = False
        self.items: collections.deque[int] = collections.deque()  # sent, not yet answered
        self.deadline = math.inf
        self.started = time.monotonic()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


class RewardPool:
    """``score(completions, answers, ids)`` → ``Scored``; workers start with the pool."""

    def __init__(self, cfg: RewardConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.failure_score = cfg.failure()
        self._workers = [_Worker(cfg) for _ in range(cfg.workers)]

    def score(self, completions: list[str], answers: list[str], ids: list[str]) -> Scored:
        if not (len(completions) == len(answers) == len(ids)):
            raise ValueError("completions, answers and ids differ in length")
        try:
            return self._score(completions, answers, ids)
        except BaseException:
            self._restart()  # answers still in flight belong to this call: drop them with their workers
            raise

    def _score(self, completions: list[str], answers: list[str], ids: list[str]) -> Scored:
        cfg, t0, n = self.cfg, time.perf_counter(), len(completions)
        results: list[RewardResult | None] = [None] * n
        chunk = max(1, min(32, n // (4 * len(self._workers))))
        queue = collections.deque(range(n))
        out = Scored([])
        failure_budget = max(_MIN_FAILURES, cfg.max_failure_frac * n)

        def fail(i: int, timed_out: bool) -> None:
            results[i] = RewardResult(self.failure_score, False)
            out.failed[i] = "timeout" if timed_out else "error"
            out.timeouts += timed_out
            out.errors += not timed_out
            if out.timeouts + out.errors > failure_budget:
                raise RewardError(
                    f"reward failed on {out.timeouts + out.errors} of {n} completions "
                    f"({out.timeouts} past reward.timeout_s={cfg.timeout_s:g}, {out.errors} crashed or raised), "
                    f"more than reward.max_failure_frac={cfg.max_failure_frac:g}; the reward is broken: "
                    f"check it on a few completions with `pc-megatron score`, or raise reward.timeout_s"
                )

        def replace(w: _Worker, timed_out: bool) -> None:
            """Kill ``w``: its current item fails, the rest of its chunk is queued again."""
            w.kill()
            if w.items:
                fail(w.items.popleft(), timed_out)
                queue.extendleft(reversed(w.items))
            self._workers[self._workers.index(w)] = _Worker(cfg)

        remaining = n
        while remaining:
            now = time.monotonic()
            for w in self._workers:
                if w.ready and not w.items and queue:
                    items = [queue.popleft() for _ in range(min(chunk, len(queue)))]
                    try:
                        w.conn.send([(i, completions[i], answers[i]) for i in items])
                    except OSError:  # it died while idle (killed, out of memory): its items wait for another
                        queue.extendleft(reversed(items))
                        replace(w, timed_out=False)
                        continue
                    w.items.extend(items)
                    w.deadline = now + cfg.timeout_s
            for w in [w for w in self._workers if w.items and w.deadline <= now]:
                remaining -= 1
                replace(w, timed_out=True)
            busy = [w.deadline for w in self._workers if w.items]
            timeout = max(0.0, min(busy) - time.monotonic()) if busy else 1.0
            arrived = wait([w.conn for w in self._workers], timeout)
            # judged after reading what has arrived: a worker that announced itself long before this
            # call (the engine's start can take minutes) has its "ready" waiting in the pipe
            late = [
                w
                for w in self._workers
                if not w.ready and w.conn not in arrived and now - w.started > max(_START_S, cfg.timeout_s)
            ]
            if late:
                raise RewardError(f"a reward worker did not start within {max(_START_S, cfg.timeout_s):g} s")
            for conn in arrived:
                w = next(w for w in self._workers if w.conn is conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    remaining -= bool(w.items)
                    code = w.proc.poll()
                    replace(w, timed_out=False)
                    if not w.ready:
                        raise RewardError(
                            f"a reward worker exited while starting (exit code {code}); see its output above"
                        ) from None
                    continue
                if msg[0] == "ready":
                    w.ready = True
                    continue
                if msg[0] == "start_error":
                    raise RewardError(f"a reward worker could not build the reward: {msg[1]}")
                i, score, correct, err = msg
                if i != w.items[0]:
                    raise RuntimeError(f"reward worker answered item {i}, expected {w.items[0]}")
                w.items.popleft()
                w.deadline = time.monotonic() + cfg.timeout_s
                remaining -= 1
                if err is None:
                    results[i] = RewardResult(score, correct)
                elif cfg.on_error == "raise":
                    raise RewardError(
                        f"reward raised {err} on prompt id '{ids[i]}' (answer {answers[i]!r}, completion "
                        f"{completions[i][:80]!r}); fix the reward or the dataset row, or set reward.on_error=count"
                    )
                else:
                    fail(i, timed_out=False)
        out.results = results  # type: ignore[assignment]
        out.seconds = time.perf_counter() - t0
        return out

    def _restart(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = [_Worker(self.cfg) for _ in range(self.cfg.workers)]

    def close(self) -> None:
        for w in self._workers:
            w.kill()
        self._workers = []

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(fd: int, parent: int) -> None:
    """A worker: build the reward, then answer every item of every chunk until the socket closes; it
    dies with the driver, even while a reward hangs (a SIGKILLed driver closes no socket it can hear)."""
    import signal

    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it ends us by closing the socket
    conn = Connection(fd)
    cfg_dict, path = conn.recv()
    sys.path[:] = path
    try:
        reward = build_reward(RewardConfig(**cfg_dict))
    except Exception as e:
        conn.send(("start_error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready",))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        for i, text, answer in chunk:
            try:
                r = reward(text, answer)
                conn.send((i, float(r.score), bool(r.correct), None))
            except Exception as e:
                conn.send((i, 0.0, False, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))

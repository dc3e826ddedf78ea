"""The one object between the loop and the engines (``Engines``), and what it is made of.

- **The gate** (``EngineGate``): one user of the engines at a time (the producer's generate calls, an
  evaluation, a weight sync that drains), with a deadline for whoever waits, the loop's holds going
  before the producer's next call; and the intervals the engines spent generating.
- **The per-call deadline**: under ``runtime=local`` the engine's calls run on a thread of their own,
  each waited for at most ``rollout.timeout_s`` (``BoundedEngine``); under Ray each actor call has its own.
- **In-flight requests at a weight update** (``rollout.inflight``): ``drain``, the update holds the gate
  (it waits for the generate call in flight); ``keep``, it goes to the engine at once, which pauses the
  generating call's requests, updates, and lets them go on (vLLM's pause and keep).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from pc_megatron.errors import TrainingError
from pc_megatron.rollout.base import RolloutEngine
from pc_megatron.rollout.config import RolloutConfig


class ProducerStopped(Exception):
    """The producer was asked to stop while it waited for the engines: the batch it was making is dropped."""


class EngineGate:
    """One user of the engines at a time, and the intervals the engines spent generating (for the busy
    and idle figures). The loop's holds (a weight sync, an evaluation) go before the producer's next call:
    a sync waits for the call in flight only.

    Deadlines bound calls, not the waits behind other bounded calls: every engine call carries its own
    deadline (``BoundedEngine`` here, the actor call under Ray), so
    - the loop, waiting behind one producer call, gives up after ``timeout_s`` + ``grace_s``;
    - the producer, waiting behind the loop (an evaluation of many calls, a sync), waits as long as the
      loop's own bounded calls take, and leaves at once when it is asked to stop (``stopping``)."""

    grace_s = 30.0
    """Beyond ``timeout_s``, for a bounded call to report that it hung."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._holder = ""
        self._since = 0.0
        self._urgent = 0  # the loop's holds waiting: the producer lets them go first
        self._busy: list[tuple[float, float]] = []  # (start, end) of generate calls, perf_counter clock

    @contextlib.contextmanager
    def hold(
        self, who: str, generating: bool = False, producer: bool = False, stopping: Callable[[], bool] | None = None
    ) -> Iterator[None]:
        """The engines for ``who`` until the block ends; ``generating``: counted as engine busy time;
        ``producer``: a call of the rollout producer, which waits while the loop waits too, and raises
        ``ProducerStopped`` once ``stopping()`` is true."""
        with self._cond:
            self._urgent += not producer
            try:
                free = self._wait(producer, stopping)
            finally:
                self._urgent -= not producer
            if not free:
                raise TrainingError(
                    f"{who} waited {self.timeout_s + self.grace_s:g} s for the engines, held by "
                    f"{self._holder or 'the loop'} for {time.perf_counter() - self._since:.0f} s (a hung generate "
                    "call); the last checkpoint is intact: fix the cause and continue with "
                    "`pc-megatron train --resume RUN_DIR`"
                )
            self._holder, self._since = who, time.perf_counter()
        try:
            yield
        finally:
            with self._cond:
                if generating:
                    self._busy.append((self._since, time.perf_counter()))
                self._holder = ""
                self._cond.notify_all()

    def _wait(self, producer: bool, stopping: Callable[[], bool] | None) -> bool:
        """Under the lock: wait for the engines (the producer also for the loop's waiters to go first)."""
        if not producer:
            return self._cond.wait_for(lambda: not self._holder, timeout=self.timeout_s + self.grace_s)
        while self._holder or self._urgent:
            if stopping is not None and stopping():
                raise ProducerStopped()
            self._cond.wait(timeout=0.5)
        return True

    def wake(self) -> None:
        """Wake the waiters (the producer, to see that it is asked to stop)."""
        with self._cond:
            self._cond.notify_all()

    def busy_within(self, start: float, end: float) -> float:
        """Seconds of ``[start, end]`` (perf_counter clock) during which the engines generated; forgets
        the intervals that ended before ``start``."""
        with self._cond:
            self._busy = [(a, b) for a, b in self._busy if b > start]
            return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self._busy)


class BoundedEngine:
    """``runtime=local``: the engine's calls made on a thread of their own, each waited for at most
    ``rollout.timeout_s``, so that a call that hangs (an engine step that never returns, a dead engine
    core) fails the run with one error naming it, as an engine actor's does under Ray. The thread is a
    daemon: a hung call does not keep the process alive. With ``rollout.inflight=keep`` an update goes
    to the engine directly: it must reach the generating call (which bounds its own wait)."""

    def __init__(self, engine: Any, timeout_s: float, inflight: str = "drain") -> None:
        self._engine, self._timeout_s, self._inflight = engine, timeout_s, inflight
        self._jobs: queue.Queue = queue.Queue()
        self._in: tuple[str, float] | None = None  # the call the engine's thread is in, and since when
        threading.Thread(target=self._serve, name="pcm-engine-calls", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            name, args, kwargs, done = job
            if not done.set_running_or_notify_cancel():
                continue
            self._in = (name, time.monotonic())
            try:
                done.set_result(getattr(self._engine, name)(*args, **kwargs))
            except BaseException as e:  # handed to the caller, raised there
                done.set_exception(e)
            finally:
                self._in = None

    def _hung(self, name: str) -> TrainingError:
        busy = self._in
        where = f"the engine's {name} call did not answer within rollout.timeout_s={self._timeout_s:g} s"
        if busy is not None and busy[0] != name:  # queued behind another call that never returned
            where += f": the engine is still in a {busy[0]} call started {time.monotonic() - busy[1]:.0f} s ago"
        return TrainingError(
            f"{where} (a hung call); the last checkpoint is intact: fix the cause and continue with "
            "`pc-megatron train --resume RUN_DIR`"
        )

    def _bounded(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            busy = self._in
            if busy is not None and time.monotonic() - busy[1] > self._timeout_s:  # known hung: do not queue
                raise self._hung(name)
            done: Future = Future()
            self._jobs.put((name, args, kwargs, done))
            try:
                return done.result(timeout=self._timeout_s)
            except TimeoutError:
                raise self._hung(name) from None

        return call

    def close(self) -> None:
        """The engine closed from the caller's thread (a hung call must not keep it open); the call
        thread ends once it is free."""
        self._jobs.put(None)
        self._engine.close()

    # the engine's surface (``RolloutEngine``), each call bounded where it may hang
    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self._bounded("generate")(*args, **kwargs)

    def generate_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._bounded("generate_stream")(*args, **kwargs)

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[float]]:
        return self._bounded("prompt_logprobs")(prompts)

    def sleep(self) -> None:
        return self._bounded("sleep")()

    def update_weights(self, named_tensors: Any, version: int) -> dict[str, float]:
        if self._inflight == "keep":  # it must reach the generating call, which bounds its own wait
            return self._engine.update_weights(named_tensors, version)
        return self._bounded("update_weights")(named_tensors, version)

    def served_dtype(self) -> str:
        return self._engine.served_dtype()

    @property
    def weight_version(self) -> int:
        return self._engine.weight_version

    @property
    def streams(self) -> bool:
        return bool(getattr(self._engine, "streams", False))


class Engines:
    """The engines as the loop, the producer and the evaluation reach them: ``fleet`` (one engine or a
    fleet of replicas) behind the gate, with the run's rule for in-flight requests at a weight update."""

    def __init__(self, fleet: RolloutEngine, rc: RolloutConfig) -> None:
        self.fleet = fleet
        self.gate = EngineGate(rc.timeout_s)
        self.inflight = rc.inflight

    @property
    def weight_version(self) -> int:
        return self.fleet.weight_version

    @property
    def streams(self) -> bool:
        """The fleet hands out each prompt's group as it completes (``generate_stream``)."""
        return bool(getattr(self.fleet, "streams", False))

    def hold(self, who: str, generating: bool = False) -> contextlib.AbstractContextManager[None]:
        """The engines for the loop's ``who`` (an evaluation, a sync) until the block ends."""
        return self.gate.hold(who, generating=generating)

    def sleep(self) -> None:
        """Free the device for the learner (colocated engines; nothing where there is nothing to free)."""
        self.fleet.sleep()

    def sync(self, step: int, push: Callable[[], dict[str, float]]) -> dict[str, float]:
        """``push()`` the learner's weights into the engines after ``step``: at once (``keep``: the
        generating call takes them mid-way), or after the call in flight (``drain``)."""
        if self.inflight == "keep":
            return push()
        with self.gate.hold(f"the weight sync after step {step}"):
            return push()

    def busy_within(self, start: float, end: float) -> float:
        return self.gate.busy_within(start, end)

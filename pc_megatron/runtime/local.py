"""``runtime=local``: the learner and one engine in this process (the engine's own workers aside)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pc_megatron.errors import ConfigError, TrainingError
from pc_megatron.learner.config import LearnerConfig
from pc_megatron.learner.learner import Learner
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.rollout.engines import build_engine


class LocalRuntime:
    def __init__(
        self,
        lc: LearnerConfig,
        rc: RolloutConfig,
        policy_dir: Path,
        seed: int,
        reference: bool,
        engine_cores: tuple[int, ...] = (),
    ) -> None:
        if lc.world_size > 1:
            raise ConfigError(
                f"learner TP x PP x DP = {lc.world_size} ranks need runtime=ray (runtime=local is one process)"
            )
        if rc.replicas > 1:
            raise ConfigError("rollout.replicas > 1 needs runtime=ray (runtime=local runs one engine)")
        self.learner = Learner(policy_dir, lc, seed=seed)
        self.ref_learner = Learner(policy_dir, lc, seed=seed) if reference else None
        engine = build_engine(rc, policy_dir, learner_bf16=bool(self.learner.cfg.bf16), cpu_cores=engine_cores)
        self.fleet = DeadlineEngine(engine, rc.timeout_s, rc.inflight)

    def sync_weights(self) -> dict[str, float]:
        return self.fleet.update_weights(self.learner.hf_named_tensors(), self.learner.version)

    def close(self) -> None:
        self.fleet.close()


class DeadlineEngine:
    """``runtime=local``: the engine's calls made on a thread of their own, each waited for at most
    ``rollout.timeout_s``, so that a call that hangs (an engine step that never returns, a dead engine
    core) fails the run with one error naming it, as an engine actor's does under Ray. The thread is a
    daemon: a hung call does not keep the process alive. With ``rollout.inflight=keep`` an update goes
    to the engine directly: it must reach the generating call (which bounds its own wait)."""

    _BOUNDED = ("generate", "generate_stream", "prompt_logprobs", "sleep", "update_weights")

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

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not built yet (copy, pickle): no engine to ask
            raise AttributeError(name)
        if name in self._BOUNDED and not (name == "update_weights" and self._inflight == "keep"):
            return self._bounded(name)
        return getattr(self._engine, name)  # state (weight_version, streams, manifest), close, the sync steps

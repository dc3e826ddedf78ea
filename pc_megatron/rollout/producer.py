"""The rollout producer: the scheduler's batches, filled in step order, at most ``rollout.max_staleness``
(η) weight versions ahead of training.

The loop asks ``take(step)`` for each step's batch. ``InlineProducer`` fills it right then (η = 0:
generate, score and allocate, then train: the synchronous loop). ``ThreadedProducer`` fills batches
in a thread of its own while the learner trains, admitting batch ``s`` only once the engines serve
the weights of update ``s - 1 - η`` or later: a batch is never *started* with weights that would be
more than η updates old when it is trained (staleness is bounded by admission, not by throwing
finished work away). A batch is one ``Scheduler.next_batch``, rounds included, so the groups a
policy filters out cost rounds and rollouts but never use up the bound; batches are trained in the
order they were made, oldest first.

The engines are shared: ``EngineGate`` lets one holder at a time use them. The producer holds it for
each generate call; the loop holds it for a weight sync and an evaluation. A weight sync therefore
waits for the call in flight to end (``drain``) and the next call runs on the new weights; every
wait is bounded and names what it waited for. (With ``rollout.inflight=keep``, vLLM in one process,
the sync does not take the gate: the engine takes the update between two steps of the call in
flight, its requests paused and kept.) The gate also records when the engines were busy, the figure
a step's ``time/engine_busy_s`` reports.

A produced batch carries the scheduler's ``state_dict`` as it was right after the batch was made:
the checkpoint of step ``s`` saves that one, so a resume regenerates the batches that were made
ahead but not trained, and every prompt is still drawn once an epoch.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass

from pc_megatron.errors import TrainingError
from pc_megatron.phases import PhaseTimes
from pc_megatron.rollout.fleet import EngineGate, ProducerStopped
from pc_megatron.rollout.generate import Rollouts
from pc_megatron.scheduler import Allocation, GenRequest, Group, OnGroup, Sample, Scheduler


@dataclass
class Produced:
    """One step's batch, as the loop receives it."""

    step: int
    allocation: Allocation
    counters: dict[str, int]
    """``Rollouts.metrics()`` of the calls that made it."""
    seconds: dict[str, float]
    """Its phases' seconds (``scheduler``, ``rollout``, ``reward``, ``engine_wait``)."""
    scheduler_state: dict
    """``Scheduler.state_dict()`` right after it was made: what a checkpoint of this step holds."""
    weights_step: int
    """The step whose weights the engines served when it was started (0 = the initial weights)."""

    def prompts(self) -> list[int]:
        """The prompts it trains, one per group (the run's ``trained.jsonl`` lists them by step)."""
        return [g.prompt for g in self.allocation.groups]


class Pace:
    """Whether the producer is asked to stop, and when its last engine call ended (the loop's deadline
    for a batch runs from there: a batch of several rounds is not one call)."""

    def __init__(self) -> None:
        self.stop = False
        self.last = time.monotonic()

    def stopping(self) -> bool:
        return self.stop

    def progressed(self) -> None:
        self.last = time.monotonic()


class GatedGenerate:
    """The scheduler's ``generate`` (``Rollouts``) with the engines held for each call, and its ``stream``
    where streaming is on (None otherwise: the policies take the barrier)."""

    def __init__(
        self, rollouts: Rollouts, gate: EngineGate, times: PhaseTimes, who: str, streaming: bool, pace: Pace
    ) -> None:
        self.rollouts, self.gate, self.times, self.who, self.pace = rollouts, gate, times, who, pace
        self.stream = self._stream if streaming else None

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        if self.pace.stopping():  # a batch that would be thrown away: not one more call for it
            raise ProducerStopped()
        with contextlib.ExitStack() as held:
            with self.times("engine_wait"):  # a weight sync or an evaluation holding the engines
                held.enter_context(
                    self.gate.hold(self.who, generating=True, producer=True, stopping=self.pace.stopping)
                )
            yield
        self.pace.progressed()

    def __call__(self, requests: list[GenRequest]) -> list[list[Sample]]:
        with self._held():
            return self.rollouts(requests)

    def _stream(self, requests: list[GenRequest], on_group: OnGroup) -> tuple[list[GenRequest], list[list[Sample]]]:
        with self._held():
            return self.rollouts.stream(requests, on_group)


class InlineProducer:
    """η = 0: each batch made when the loop asks for it, in the loop's own thread."""

    max_staleness = 0

    def __init__(
        self,
        scheduler: Scheduler,
        rollouts: Rollouts,
        gate: EngineGate,
        policy_version: Callable[[], int],
        streaming: bool = False,
    ) -> None:
        self.scheduler, self.rollouts, self.gate, self.policy_version = scheduler, rollouts, gate, policy_version
        self.streaming = streaming
        self.weights_step = 0

    def start(self, first_step: int, last_step: int, weights_step: int) -> None:
        self.weights_step = weights_step

    def weights_updated(self, weights_step: int) -> None:
        self.weights_step = weights_step

    def take(self, step: int, times: PhaseTimes) -> Produced:
        version = self.policy_version()
        return make_batch(
            self.scheduler,
            self.rollouts,
            self.gate,
            step,
            times,
            version,
            self.weights_step,
            self.streaming,
            copy=False,
        )

    def close(self) -> None:
        return None


class ThreadedProducer:
    """η >= 1: batches made ahead in a thread while the learner trains."""

    def __init__(
        self,
        scheduler: Scheduler,
        rollouts: Rollouts,
        gate: EngineGate,
        policy_version: Callable[[], int],
        max_staleness: int,
        timeout_s: float,
        streaming: bool = False,
    ) -> None:
        self.scheduler, self.rollouts, self.gate, self.policy_version = scheduler, rollouts, gate, policy_version
        self.max_staleness, self.timeout_s, self.streaming = max_staleness, timeout_s, streaming
        self.weights_step = 0
        self._made: dict[int, Produced] = {}
        self._cond = threading.Condition()
        self._pace = Pace()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._working_on: tuple[int, float] | None = None  # (step, since) of the batch being made

    def admits(self, step: int) -> bool:
        """Batch ``step`` may start: trained after update ``step - 1``, it would be at most η updates old."""
        return step - 1 - self.weights_step <= self.max_staleness

    def start(self, first_step: int, last_step: int, weights_step: int) -> None:
        self.weights_step = weights_step
        self._thread = threading.Thread(
            target=self._run, args=(first_step, last_step), name="rollout-producer", daemon=True
        )
        self._thread.start()

    def _run(self, first_step: int, last_step: int) -> None:
        try:
            for step in range(first_step, last_step + 1):
                with self._cond:
                    self._cond.wait_for(lambda s=step: self._pace.stop or self.admits(s))
                    if self._pace.stop:
                        return
                    self._working_on = (step, time.perf_counter())
                    self._pace.progressed()
                times = PhaseTimes()
                version, weights = self.policy_version(), self.weights_step
                made = make_batch(
                    self.scheduler,
                    self.rollouts,
                    self.gate,
                    step,
                    times,
                    version,
                    weights,
                    self.streaming,
                    pace=self._pace,
                )
                with self._cond:
                    self._made[step] = made
                    self._working_on = None
                    self._cond.notify_all()
        except ProducerStopped:  # asked to stop: the batch in the making is dropped
            return
        except BaseException as e:  # handed to the loop's next take()
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def weights_updated(self, weights_step: int) -> None:
        with self._cond:
            self.weights_step = weights_step
            self._cond.notify_all()

    def take(self, step: int, times: PhaseTimes) -> Produced:
        """Batch ``step`` (waited for: the learner's idle time, phase ``wait_rollout``). The wait gives up
        when the producer's last engine call ended more than ``timeout_s`` + the gate's grace ago (each
        call is bounded; a batch of several rounds may take longer than one)."""
        with times("wait_rollout"), self._cond:
            start = time.monotonic()
            while step not in self._made and self._error is None:
                if not self._thread or not self._thread.is_alive():
                    raise TrainingError(f"the rollout producer stopped before making the batch of step {step}")
                left = max(start, self._pace.last) + self.timeout_s + self.gate.grace_s - time.monotonic()
                if left <= 0:
                    on = self._working_on
                    doing = f"making step {on[0]}'s batch for {time.perf_counter() - on[1]:.0f} s" if on else "idle"
                    raise TrainingError(
                        f"waited {time.monotonic() - start:.0f} s for the batch of step {step} from the rollout "
                        f"producer ({doing}, no engine call ended for {self.timeout_s + self.gate.grace_s:g} s; the "
                        f"engines serve update {self.weights_step}'s weights); the last checkpoint is intact: fix "
                        "the cause and continue with `pc-megatron train --resume RUN_DIR`"
                    )
                self._cond.wait(timeout=min(left, 1.0))
            if self._error is not None:
                raise self._error
            return self._made.pop(step)

    def close(self) -> None:
        """Stop making batches: the call in flight finishes (bounded by the engines' own deadlines); no
        further call starts for a batch that would be thrown away."""
        with self._cond:
            self._pace.stop = True
            self._cond.notify_all()
        self.gate.wake()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
            self._thread = None


def make_batch(
    scheduler: Scheduler,
    rollouts: Rollouts,
    gate: EngineGate,
    step: int,
    times: PhaseTimes,
    policy_version: int,
    weights_step: int,
    streaming: bool,
    copy: bool = True,
    pace: Pace | None = None,
) -> Produced:
    """One step's allocation: ``scheduler.next_batch`` with every generate call holding the engines.
    ``streaming``: the policy may stream (``Rollouts.stream``); ``copy``: the scheduler's state is copied
    (it will change before the loop saves it)."""
    rollouts.begin_step(step, times)
    who = f"the rollout producer (step {step}'s batch)"
    generate = GatedGenerate(rollouts, gate, times, who, streaming, pace or Pace())
    with times("scheduler"):  # its own decisions; the fleet and reward calls it makes are timed apart
        allocation = scheduler.next_batch(step, generate, policy_version=policy_version)
    return Produced(
        step,
        allocation,
        rollouts.metrics(),
        dict(times.seconds),
        deepcopy(scheduler.state_dict()) if copy else scheduler.state_dict(),
        weights_step,
    )


LEARNER_PHASES = ("logprob", "train", "optimizer", "sync")
"""The phases of a step in which the learner computes (its busy time)."""


def staleness_metrics(groups: list[Group], update_versions: list[int], version: int) -> dict[str, float]:
    """How old the trained samples are, in updates: a sample generated by the weights of version ``v``
    and trained by version ``version`` is as many updates old as ``update_versions`` (the learner's
    version after each update, ascending) holds in ``(v, version]``. ``rollout/staleness_max`` and the
    token-weighted ``rollout/staleness_mean``; for groups made of a pilot and its commit,
    ``rollout/commit_lag_max`` and ``_mean``: the updates between the pilot and the commit samples."""
    if not groups:
        return {}
    now = bisect.bisect_right(update_versions, version)

    def index(v: int) -> int:
        return bisect.bisect_right(update_versions, v)

    lags = [(now - index(s.policy_version), max(s.tokens, 1)) for g in groups for s in g.samples]
    out = {
        "rollout/staleness_max": max(lag for lag, _ in lags),
        "rollout/staleness_mean": sum(lag * t for lag, t in lags) / sum(t for _, t in lags),
    }
    commit_lags = [
        max(index(s.policy_version) for s in g.samples[g.pilot_samples :])
        - min(index(s.policy_version) for s in g.samples[: g.pilot_samples])
        for g in groups
        if 0 < g.pilot_samples < len(g.samples)
    ]
    if commit_lags:
        out |= {
            "rollout/commit_lag_max": max(commit_lags),
            "rollout/commit_lag_mean": sum(commit_lags) / len(commit_lags),
        }
    return out


def make_producer(
    max_staleness: int, scheduler: Scheduler, rollouts: Rollouts, gate: EngineGate, version, streaming: bool
) -> InlineProducer | ThreadedProducer:
    """The producer of the loop's batches: made in the loop at η = 0, ahead in a thread at η >= 1."""
    if max_staleness == 0:
        return InlineProducer(scheduler, rollouts, gate, version, streaming)
    return ThreadedProducer(scheduler, rollouts, gate, version, max_staleness, gate.timeout_s, streaming)

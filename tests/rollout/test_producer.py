"""The rollout producer (``pc_megatron/rollout/producer.py``): admission by staleness, the engine gate
that drains a generate call before a weight sync, bounded waits that name what they waited for."""

from __future__ import annotations

import random
import threading
import time

import pytest

from pc_megatron.errors import TrainingError
from pc_megatron.phases import PhaseTimes
from pc_megatron.rollout.fleet import EngineGate
from pc_megatron.rollout.producer import InlineProducer, ThreadedProducer, staleness_metrics
from pc_megatron.scheduler import Group, Sample, Scheduler, SchedulerConfig


class FakeRollouts:
    """The scheduler's generate, recording for each call the step it serves and the step whose weights
    the engines hold (read from the producer, as the engines would serve them)."""

    def __init__(self, rates: list[float], delay_s: float = 0.0, fail: str = "") -> None:
        self.rates, self.delay_s, self.fail = rates, delay_s, fail
        self.calls: list[tuple[int, int]] = []
        self.producer = None
        self.step, self.rng = 0, random.Random(0)
        self.block = threading.Event()
        self.block.set()

    def begin_step(self, step: int, times: PhaseTimes) -> None:
        self.step = step

    def __call__(self, requests):
        if self.fail:
            raise RuntimeError(self.fail)
        self.block.wait()
        self.calls.append((self.step, self.producer.weights_step))
        time.sleep(self.delay_s)
        version = self.producer.weights_step  # the version of the weights that sample
        return [
            [
                Sample(c, float(c), version, None, 4)
                for c in (self.rng.random() < self.rates[q.prompt] for _ in range(q.n))
            ]
            for q in requests
        ]

    def metrics(self) -> dict[str, int]:
        return {}


def _producer(policy: str, eta: int, rollouts: FakeRollouts, timeout_s: float = 30.0):
    sched = Scheduler(SchedulerConfig(policy=policy), 200, 4, 8, seed=1)
    gate = EngineGate(timeout_s)
    if eta == 0:
        producer = InlineProducer(sched, rollouts, gate, lambda: 0)
    else:
        producer = ThreadedProducer(sched, rollouts, gate, lambda: 0, eta, timeout_s)
    rollouts.producer = producer
    return producer, gate


@pytest.mark.parametrize("policy", ["grpo", "dapo", "pilot_commit", "adaptive"])
@pytest.mark.parametrize("eta", [1, 2])
def test_a_batch_starts_only_with_weights_at_most_eta_updates_old_when_trained(policy, eta):
    """The loop trains step s after update s - 1: every generate call for step s ran on the weights of
    step >= s - 1 - η, whatever the learner's pace, and the batches come in step order."""
    rates = [random.Random(p).random() for p in range(200)]
    rollouts = FakeRollouts(rates, delay_s=0.002)
    producer, gate = _producer(policy, eta, rollouts)
    producer.start(1, 12, weights_step=0)
    try:
        for step in range(1, 13):
            made = producer.take(step, PhaseTimes())
            assert made.step == step
            time.sleep(random.Random(step).random() * 0.02)  # the learner's step
            with gate.hold(f"the weight sync after step {step}"):
                producer.weights_updated(step)
    finally:
        producer.close()
    assert rollouts.calls and all(s - 1 - w <= eta for s, w in rollouts.calls)
    assert max(s - 1 - w for s, w in rollouts.calls) == eta  # it did run ahead: the bound is met, not avoided


def test_eta_zero_is_the_synchronous_order():
    rollouts = FakeRollouts([0.5] * 200)
    producer, _ = _producer("grpo", 0, rollouts)
    producer.start(1, 5, weights_step=0)
    for step in range(1, 6):
        producer.take(step, PhaseTimes())
        producer.weights_updated(step)
    assert [s - 1 - w for s, w in rollouts.calls] == [0] * 5


def test_a_weight_sync_waits_for_the_generate_call_in_flight():
    """drain: the sync holds the engines only once the producer's call has returned."""
    rollouts = FakeRollouts([0.5] * 200)
    rollouts.block.clear()
    producer, gate = _producer("grpo", 1, rollouts)
    producer.start(1, 3, weights_step=0)
    time.sleep(0.2)  # the producer is inside its first call, held by the gate
    took = []

    def sync():
        with gate.hold("the weight sync after step 1"):
            took.append(len(rollouts.calls))

    t = threading.Thread(target=sync)
    t.start()
    time.sleep(0.2)
    assert took == []  # still waiting for the call
    rollouts.block.set()
    t.join(5)
    assert took == [1]
    producer.close()


def test_a_held_gate_fails_the_waiter_within_its_deadline_naming_the_holder():
    gate = EngineGate(timeout_s=0.3)
    gate.grace_s = 0.0
    release = threading.Event()

    def holder():
        with gate.hold("the rollout producer (step 7's batch)", generating=True, producer=True):
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    with pytest.raises(
        TrainingError, match=r"the weight sync after step 6 waited 0.3 s .* held by the rollout producer"
    ):
        with gate.hold("the weight sync after step 6"):
            pass
    assert time.monotonic() - t0 < 2
    release.set()
    t.join()


def test_a_stalled_producer_fails_the_loop_within_its_deadline():
    rollouts = FakeRollouts([0.5] * 200)
    rollouts.block.clear()  # the engines never answer
    producer, gate = _producer("grpo", 1, rollouts, timeout_s=0.5)
    gate.grace_s = 0.0
    producer.start(1, 3, weights_step=0)
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=r"waited \d+ s for the batch of step 1 from the rollout producer.*0.5 s"):
        producer.take(1, PhaseTimes())
    assert time.monotonic() - t0 < 3
    rollouts.block.set()
    producer.close()


def test_an_error_in_the_producer_reaches_the_loop():
    rollouts = FakeRollouts([0.5] * 200, fail="engine replica 0 died")
    producer, _ = _producer("grpo", 1, rollouts)
    producer.start(1, 3, weights_step=0)
    with pytest.raises(RuntimeError, match="engine replica 0 died"):
        producer.take(1, PhaseTimes())
    producer.close()


def test_staleness_counts_updates_between_the_sampling_and_the_training_weights():
    def sample(version: int, tokens: int = 2) -> Sample:
        return Sample(True, 1.0, version, None, tokens)

    versions = [2, 4, 6]  # three updates of two optimizer steps each
    groups = [Group(0, [sample(2), sample(4)]), Group(1, [sample(2), sample(6, tokens=6)], pilot_samples=1)]
    out = staleness_metrics(groups, versions, 6)
    assert out["rollout/staleness_max"] == 2  # version 2: updates 2 and 3 since
    assert out["rollout/staleness_mean"] == pytest.approx((2 * 2 + 1 * 2 + 2 * 2 + 0 * 6) / 12)  # token-weighted
    assert out["rollout/commit_lag_max"] == 2  # a pilot of version 2 committed by version 6


def test_at_eta_one_an_evaluation_longer_than_the_call_deadline_passes():
    """The loop holds the engines for an evaluation of 1.5 x ``rollout.timeout_s`` (many calls, each
    bounded): the producer waits behind it and the run goes on (it died there, "a hung call")."""
    rollouts = FakeRollouts([0.5] * 200)
    producer, gate = _producer("grpo", 1, rollouts, timeout_s=0.4)
    gate.grace_s = 0.0
    with gate.hold("the held-out evaluation at step 0", generating=True):
        producer.start(1, 2, weights_step=0)
        time.sleep(0.6)
    try:
        assert producer.take(1, PhaseTimes()).step == 1
    finally:
        producer.close()


def test_a_batch_of_three_rounds_each_shorter_than_the_deadline_passes():
    """DAPO refills a batch in rounds; three calls of 0.6 x ``rollout.timeout_s`` each make one batch of
    1.8 x: the loop's wait is bounded per call, not per batch."""
    rollouts = FakeRollouts([0.5 if p % 10 == 0 else 0.0 for p in range(200)], delay_s=0.6)  # few mixed groups
    sched = Scheduler(SchedulerConfig(policy="dapo", max_rounds=3), 200, 4, 8, seed=1)
    gate = EngineGate(1.0)
    gate.grace_s = 0.0
    producer = ThreadedProducer(sched, rollouts, gate, lambda: 0, 1, 1.0)
    rollouts.producer = producer
    producer.start(1, 1, weights_step=0)
    try:
        made = producer.take(1, PhaseTimes())
    finally:
        producer.close()
    assert len(rollouts.calls) == 3 and made.step == 1


def test_a_hung_call_still_fails_the_loop_within_the_deadline_and_its_grace():
    rollouts = FakeRollouts([0.5] * 200)
    rollouts.block.clear()  # the engines never answer (an engine without its own deadline)
    producer, gate = _producer("grpo", 1, rollouts, timeout_s=0.3)
    gate.grace_s = 0.2
    producer.start(1, 2, weights_step=0)
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match="no engine call ended for 0.5 s"):
        producer.take(1, PhaseTimes())
    assert time.monotonic() - t0 < 0.5 + 1.5
    rollouts.block.set()
    producer.close()


def test_stopping_does_not_wait_for_the_rest_of_a_batch_that_is_thrown_away():
    """close() (a second signal, an error, the stop after a SIGTERM's checkpoint) lets the call in flight
    finish and starts no further call of the batch."""
    rollouts = FakeRollouts([0.5 if p % 10 == 0 else 0.0 for p in range(200)], delay_s=1.0)  # several rounds
    sched = Scheduler(SchedulerConfig(policy="dapo", max_rounds=4), 200, 4, 8, seed=1)
    gate = EngineGate(30.0)
    producer = ThreadedProducer(sched, rollouts, gate, lambda: 0, 1, 30.0)
    rollouts.producer = producer
    producer.start(1, 1, weights_step=0)
    deadline = time.monotonic() + 10
    while not rollouts.calls and time.monotonic() < deadline:  # inside the first round's call
        time.sleep(0.01)
    t0 = time.monotonic()
    producer.close()
    assert time.monotonic() - t0 < 2.0 and len(rollouts.calls) == 1  # four rounds would take >= 3 s more

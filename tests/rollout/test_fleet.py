"""The one object between the loop and the engines (``pc_megatron/rollout/fleet.py``): the gate, the
per-call deadline, and how a weight update meets requests in flight."""

from __future__ import annotations

import threading
import time

import pytest

from pc_megatron.errors import TrainingError
from pc_megatron.rollout.config import RolloutConfig
from pc_megatron.rollout.fleet import BoundedEngine, Engines


def test_a_call_queued_behind_a_hung_one_names_it_and_a_known_hung_engine_is_not_queued_on():
    release = threading.Event()

    class Stuck:
        weight_version = 7

        def generate(self, *args):
            release.wait(60)
            return ["done"]

        def update_weights(self, named, version):
            return {"weight_sync_s": 0.0}

        def close(self):
            release.set()

    engine = BoundedEngine(Stuck(), timeout_s=0.5)
    with pytest.raises(TrainingError, match=r"generate call did not answer within rollout.timeout_s=0.5 s"):
        engine.generate([[1]], 1, None, 0)
    time.sleep(0.2)  # the generate call is now well past its deadline
    t0 = time.monotonic()
    with pytest.raises(TrainingError, match=r"update_weights call .* still in a generate call started \d+ s ago"):
        engine.update_weights([], 1)
    assert time.monotonic() - t0 < 0.4  # known hung: refused at once, not after another deadline
    assert engine.weight_version == 7  # state is the engine's own
    engine.close()


class _Fleet:
    weight_version = 0

    def sleep(self):
        pass


@pytest.mark.parametrize("inflight", ["drain", "keep"])
def test_a_weight_update_waits_for_the_call_in_flight_only_when_draining(inflight):
    """``drain``: the sync holds the gate, so it waits for the generate call holding it; ``keep``: it
    goes to the engine at once (the generating call takes the weights mid-way)."""
    engines = Engines(_Fleet(), RolloutConfig(timeout_s=5.0, inflight=inflight))
    entered, release, order = threading.Event(), threading.Event(), []

    def generating():
        with engines.gate.hold("the rollout producer", generating=True, producer=True):
            entered.set()
            release.wait(5)
            order.append("generate done")

    t = threading.Thread(target=generating)
    t.start()
    entered.wait(5)
    threading.Timer(0.3, release.set).start()
    engines.sync(3, lambda: order.append("weights pushed") or {})
    t.join()
    expected = ["weights pushed", "generate done"] if inflight == "keep" else ["generate done", "weights pushed"]
    assert order == expected
    assert engines.busy_within(0.0, time.perf_counter()) > 0.2  # the generate call's interval was counted

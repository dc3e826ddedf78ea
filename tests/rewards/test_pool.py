"""The reward pool (``pc_megatron/rewards/pool.py``): per-item timeouts, crashes and raises in worker
processes, counted or reported, and the step goes on."""

from __future__ import annotations

import time

import pytest

from pc_megatron.errors import RewardError
from pc_megatron.rewards.config import RewardConfig
from pc_megatron.rewards.pool import RewardPool


def _ids(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def test_scores_come_back_in_input_order_across_workers():
    texts = [str(i % 7) for i in range(300)]
    answers = [str(i % 5) for i in range(300)]
    with RewardPool(RewardConfig(workers=2)) as pool:
        out = pool.score(texts, answers, _ids(300))
    assert [r.correct for r in out.results] == [t == a for t, a in zip(texts, answers, strict=True)]
    assert (out.timeouts, out.errors) == (0, 0)


def test_a_first_call_long_after_the_workers_started_finds_them_ready(monkeypatch):
    """The engine's start can take minutes before the first reward call: the workers' "ready",
    sent long before, is read before anyone is judged late (it once failed every such run)."""
    from pc_megatron.rewards import pool as pool_module

    monkeypatch.setattr(pool_module, "_START_S", 0.5)
    with RewardPool(RewardConfig(workers=2, timeout_s=0.1)) as pool:
        time.sleep(2.0)  # far past the start deadline, every worker long since ready
        out = pool.score(["1", "2"], ["1", "3"], _ids(2))
    assert [r.correct for r in out.results] == [True, False]


def test_a_hanging_item_is_cut_off_counted_and_the_rest_scored():
    texts = ["1", "hang", "2", "3", "hang", "4"]
    answers = ["1", "1", "2", "0", "1", "4"]
    cfg = RewardConfig(function="rewards_for_tests:exact", workers=2, timeout_s=0.5, failure_score=-1.0)
    with RewardPool(cfg) as pool:
        t0 = time.perf_counter()
        out = pool.score(texts, answers, _ids(6))
        elapsed = time.perf_counter() - t0
        assert [r.correct for r in out.results] == [True, False, True, False, False, True]
        assert [r.score for r in out.results] == [1.0, -1.0, 1.0, 0.0, -1.0, 1.0]
        assert (out.timeouts, out.errors) == (2, 0)
        assert elapsed < 10  # two cut-offs of 0.5 s plus worker restarts, not 600 s
        # the replaced workers serve the next call
        assert [r.correct for r in pool.score(["5", "6"], ["5", "0"], _ids(2)).results] == [True, False]


def test_a_crashing_item_is_counted_and_its_worker_replaced():
    cfg = RewardConfig(function="rewards_for_tests:exact", workers=1, timeout_s=5)
    with RewardPool(cfg) as pool:
        out = pool.score(["1", "crash", "2"], ["1", "1", "2"], _ids(3))
        assert [r.correct for r in out.results] == [True, False, True]
        assert (out.timeouts, out.errors) == (0, 1)


def test_a_raising_reward_names_the_prompt_or_is_counted():
    cfg = RewardConfig(function="rewards_for_tests:exact", workers=2, timeout_s=5)
    with RewardPool(cfg) as pool:
        with pytest.raises(RewardError, match="ValueError: cannot parse on prompt id 'p1'.*reward.on_error=count"):
            pool.score(["1", "raise", "2"], ["1", "1", "2"], _ids(3))
        assert pool.score(["3"], ["3"], _ids(1)).results[0].correct  # usable after the error
    with RewardPool(RewardConfig(function="rewards_for_tests:exact", on_error="count")) as pool:
        out = pool.score(["1", "raise", "2"], ["1", "1", "2"], _ids(3))
        assert [r.correct for r in out.results] == [True, False, True] and out.errors == 1


def test_a_reward_that_fails_everywhere_stops_the_run():
    cfg = RewardConfig(function="rewards_for_tests:always_hangs", workers=2, timeout_s=0.2)
    with RewardPool(cfg) as pool:
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match=r"failed on 9 of 12 completions \(9 past reward.timeout_s=0.2"):
            pool.score(["1"] * 12, ["1"] * 12, _ids(12))
        assert time.perf_counter() - t0 < 20


def test_a_worker_that_died_while_idle_is_replaced_at_the_next_call():
    """Killed between two calls (the OOM killer, an operator): the next call is served by a new worker
    instead of stopping the run with BrokenPipeError."""
    with RewardPool(RewardConfig(workers=2)) as pool:
        t0 = time.monotonic()
        while not all(w.ready for w in pool._workers) and time.monotonic() - t0 < 60:  # both started
            pool.score([str(i) for i in range(40)], ["1"] * 40, _ids(40))
        for w in pool._workers:
            w.proc.kill()
            w.proc.wait()
        out = pool.score([str(i) for i in range(40)], ["3"] * 40, _ids(40))
    assert [r.correct for r in out.results] == [i == 3 for i in range(40)] and (out.timeouts, out.errors) == (0, 0)


def test_a_worker_in_a_hung_reward_dies_with_a_sigkilled_driver(tmp_path):
    """The driver gone without closing anything (SIGKILL) while a reward hangs: its workers end too."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from tests.settings import WORKERS

    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from pc_megatron.rewards.config import RewardConfig\nfrom pc_megatron.rewards.pool import RewardPool\n"
        "pool = RewardPool(RewardConfig(function='rewards_for_tests:always_hangs', workers=2, timeout_s=600))\n"
        "print(' '.join(str(w.proc.pid) for w in pool._workers), flush=True)\n"
        "pool.score(['1', '2'], ['1', '2'], ['a', 'b'])\n"
    )
    driver = subprocess.Popen([sys.executable, "-c", code, str(WORKERS)], stdout=subprocess.PIPE, text=True)
    workers = [psutil.Process(int(p)) for p in driver.stdout.readline().split()]
    time.sleep(3)  # both workers inside the hanging reward
    assert all(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"reward workers outlived the killed driver: {[p.pid for p in alive]}"


def test_workers_started_from_a_thread_that_ends_keep_serving():
    """At η >= 1 the producer thread starts replacement workers; the parent-death signal fires when the
    starting *thread* ends, so those workers died while the last steps and the evaluation still scored."""
    import threading

    made: list[RewardPool] = []

    def start_and_score() -> None:  # the workers are up (and watching their parent) before the thread ends
        pool = RewardPool(RewardConfig(workers=2))
        pool.score(["1", "2"], ["1", "2"], ["x", "y"])
        made.append(pool)

    t = threading.Thread(target=start_and_score)
    t.start()
    t.join()
    (pool,) = made
    try:
        time.sleep(0.5)
        assert all(w.proc.poll() is None for w in pool._workers)
        scored = pool.score(["3", "4"], ["3", "5"], ["a", "b"])
        assert [r.correct for r in scored.results] == [True, False] and scored.errors == 0
    finally:
        pool.close()

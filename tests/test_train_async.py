"""The loop with batches made ahead (``rollout.max_staleness``, ``pc_megatron/rollout/producer.py``) end to
end on CPU: η = 0 through the threaded producer is the synchronous loop bit for bit; at η >= 1 staleness
stays within η; a run killed anywhere with work in flight resumes with every prompt trained once an epoch;
a hung engine fails the run within its deadline."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from pc_megatron import train as train_module
from pc_megatron.config import load_config
from pc_megatron.errors import TrainingError
from pc_megatron.rollout import producer as producer_module
from pc_megatron.rollout.generate import Rollouts
from pc_megatron.run.logs import read_metrics
from pc_megatron.train import train
from tests.settings import SMALL, comparable, hang_generate_at

# a pool of 32 prompts trained 8 a step: an epoch every 4 steps, each batch within one epoch
POOL = [*SMALL, "data.synthetic.pool_size=32", "checkpoint.every_steps=1", "eval.every_steps=3"]


def _weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from pc_megatron.checkpoint.convert import megatron_to_hf_folder

    out = run_dir.parent / f"{run_dir.name}-hf"
    megatron_to_hf_folder(run_dir, out, log=lambda *_: None)
    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors |= load_file(f)
    return tensors


def _trained(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trained.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("policy", ["grpo", "dapo", "pilot_commit", "adaptive"])
def test_eta_zero_through_the_threaded_producer_is_the_synchronous_loop(policy, cache_dir, tmp_path, monkeypatch):
    """The threaded producer held to η = 0 (each batch admitted only once the previous update is
    synced) gives the synchronous loop's metrics rows, trained prompts and final weights, bit for bit."""
    cfg = load_config("tiny", [*POOL, "steps=3", f"scheduler.policy={policy}", "scheduler.p_lower=0.0"])
    train(cfg, tmp_path / "inline")

    def threaded(max_staleness, scheduler, rollouts, gate, version, streaming):
        return producer_module.ThreadedProducer(scheduler, rollouts, gate, version, 0, gate.timeout_s, streaming)

    monkeypatch.setattr(train_module, "make_producer", threaded)
    train(cfg, tmp_path / "threaded")
    inline, thread = read_metrics(tmp_path / "inline"), read_metrics(tmp_path / "threaded")
    assert [comparable(r) for r in inline] == [comparable(r) for r in thread]
    # the threaded producer did make them: the loop waited for its batches, the inline loop never does
    assert all("time_wait_rollout_s" in r for r in thread[1:]) and not any("time_wait_rollout_s" in r for r in inline)
    assert _trained(tmp_path / "inline") == _trained(tmp_path / "threaded")
    a, b = _weights(tmp_path / "inline"), _weights(tmp_path / "threaded")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Killed(Exception):
    """A simulated kill at one point of the run (a generate call of the producer, or an update)."""


def _kill_at(monkeypatch, point: int) -> None:
    """Raise ``Killed`` at the ``point``-th event of the run: a generate call (in the producer's thread)
    or an optimizer update (in the loop), whichever comes."""
    events = {"n": 0}
    call, update = Rollouts.__call__, train_module.rl_update

    def tick():
        events["n"] += 1
        if events["n"] == point:
            raise Killed(f"event {point}")

    def killing_call(self, requests):
        tick()
        return call(self, requests)

    def killing_update(*args, **kwargs):
        tick()
        return update(*args, **kwargs)

    monkeypatch.setattr(Rollouts, "__call__", killing_call)
    monkeypatch.setattr(train_module, "rl_update", killing_update)


@pytest.mark.parametrize(("policy", "eta"), [("grpo", 1), ("pilot_commit", 2)])
def test_a_run_killed_at_random_points_resumes_with_every_prompt_trained_once_an_epoch(
    policy, eta, cache_dir, tmp_path, monkeypatch
):
    """Killed at random points with batches made ahead (a generate call or an update), resumed each
    time from the last checkpoint: every step trained once, no prompt twice in an epoch (GRPO: every
    prompt of every epoch exactly once, in the uninterrupted run's order), staleness never above η,
    the replay buffer and the pilots' versions carried through."""
    steps = 8
    over = [*POOL, f"steps={steps}", f"scheduler.policy={policy}", f"rollout.max_staleness={eta}", "progress=false"]
    if policy == "pilot_commit":
        over += ["scheduler.p_lower=0.0", "scheduler.max_rounds=2"]
    cfg = load_config("tiny", over)
    full = tmp_path / "full"
    train(cfg, full)
    run = tmp_path / "killed"
    rng = random.Random(f"{policy}/{eta}")
    points = [rng.randint(1, 4) for _ in range(5)]  # within the next two steps: each one kills
    for point in points:
        with monkeypatch.context() as m, pytest.raises(Killed):
            _kill_at(m, point)
            train(cfg, run, resume=(run / "checkpoints" / "latest").exists())
    train(cfg, run, resume=True)
    rows, trained = read_metrics(run), _trained(run)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    assert [t["step"] for t in trained] == list(range(1, steps + 1))
    # fresh batches within η; pilots a policy keeps for later steps within scheduler.max_off_steps + 1 more
    bound = eta if policy == "grpo" else eta + cfg.scheduler.max_off_steps + 1
    assert max(r["rollout/staleness_max"] for r in rows[1:]) <= bound
    seen: set[tuple[int, int]] = set()
    for t in trained:
        for p in t["prompts"]:
            assert (t["epoch"], p) not in seen, f"prompt {p} trained twice in epoch {t['epoch']}"
            seen.add((t["epoch"], p))
    if policy == "grpo":
        assert [t["prompts"] for t in trained] == [t["prompts"] for t in _trained(full)]
        for epoch in {t["epoch"] for t in trained}:  # steps 1-8: two whole epochs of 32
            assert sorted(p for e, p in seen if e == epoch) == list(range(32))
    else:  # pilots carried across the kills: some trained groups hold pilots older than their commits
        assert any(r.get("rollout/commit_lag_max", 0) >= 1 for r in rows[1:])


def test_sigkill_with_batches_in_flight_then_resume(cache_dir, tmp_path):
    """A real SIGKILL at η = 1 while the producer is ahead: the resumed run trains each step once, each
    prompt once an epoch, within the bound."""
    args = [*POOL, "steps=8", "rollout.max_staleness=1", f"out_dir={tmp_path}", "name=killed"]
    env = {**os.environ, "PC_MEGATRON_CACHE": str(cache_dir)}
    cmd = [sys.executable, "-m", "pc_megatron.cli", "train", "tiny", *args]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.exists() and latest.read_text() >= "step_000003"):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    time.sleep(random.Random(0).random() * 0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert read_metrics(tmp_path / "killed")[-1]["step"] < 8
    resume = [sys.executable, "-m", "pc_megatron.cli", "train", "--resume", str(tmp_path / "killed")]
    assert subprocess.run(resume, env=env, timeout=600).returncode == 0
    trained = _trained(tmp_path / "killed")
    assert [t["step"] for t in trained] == list(range(1, 9))
    pairs = [(t["epoch"], p) for t in trained for p in t["prompts"]]
    assert len(pairs) == len(set(pairs)) == 8 * 8
    assert all(r["rollout/staleness_max"] <= 1 for r in read_metrics(tmp_path / "killed")[1:])


def test_a_hung_engine_fails_the_run_within_its_deadline_naming_the_wait(cache_dir, tmp_path, monkeypatch):
    """The engines stop answering at the third generate call: the loop waiting for that batch fails
    within rollout.timeout_s with one error that names the wait, and the last checkpoint stays."""
    hang_generate_at(monkeypatch, 4)  # step 0's evaluation, steps 1 and 2, then step 3's batch hangs
    cfg = load_config(
        "tiny", [*POOL, "steps=5", "rollout.max_staleness=1", "rollout.timeout_s=8", "eval.every_steps=10"]
    )
    t0 = time.monotonic()
    hung = r"waited 8 s for the batch of step \d|waited 8 s for the engines|the engine is still in a generate call"
    hung += r"|generate call did not answer within"
    with pytest.raises(TrainingError, match=hung):
        train(cfg, tmp_path / "hung")
    assert time.monotonic() - t0 < 120
    assert (tmp_path / "hung" / "checkpoints" / "latest").exists()


@pytest.mark.gpu
def test_the_asynchronous_loop_on_a_gpu(cache_dir, tmp_path):
    """η = 1 with the learner and the hf engine on one CUDA device (runtime=local): batches made ahead
    train within the bound, the correction sees the stale tokens, the engine serves each sync."""
    cfg = load_config("tiny", [*POOL, "steps=5", "rollout.max_staleness=1", "eval.every_steps=5"])
    train(cfg, tmp_path / "gpu")
    rows = read_metrics(tmp_path / "gpu")[1:]
    staleness = [r["rollout/staleness_max"] for r in rows][1:]
    # within the bound, and made ahead (a batch the rollout thread had not begun before a quick sync is fresh)
    assert all(s <= 1 for s in staleness) and 1 in staleness, staleness
    assert all(r["engine_weight_version"] == r["policy_version"] for r in rows)
    assert all(0 < r["correction/ess"] <= 1 and r["logprob_mismatch_max"] < 1e-2 for r in rows)


@pytest.mark.gpu
def test_inflight_keep_with_vllm_on_one_gpu(cache_dir, tmp_path):
    """η = 1 with vLLM's CUDA engine kept generating across weight updates (rollout.inflight=keep, runtime=local,
    one GPU shared with the bf16 learner: the engine's share at 0.3): each update lands mid-window, the
    tokens after it carry the new version, staleness stays within the bound, and the engine serves each
    sync. The prefix cache is off under keep (a block cached before an update holds the old weights)."""
    pytest.importorskip("vllm")
    over = ["rollout.backend=vllm", "rollout.inflight=keep", "rollout.max_staleness=1", "learner.bf16=true",
            "rollout.vllm.gpu_memory_utilization=0.3", "steps=4", "eval.every_steps=4"]  # fmt: skip
    cfg = load_config("tiny", [*POOL, *over])
    train(cfg, tmp_path / "keep")
    rows = read_metrics(tmp_path / "keep")[1:]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
    assert all(r["engine_weight_version"] == r["policy_version"] for r in rows)
    assert all(r["logprob_mismatch_max"] < 0.1 for r in rows)  # bf16 on both sides

"""RL training loop, as verbs on roles (``pc_megatron/runtime`` places them in this process or on
Ray actors): per step,

    allocation = scheduler.next_batch(rollouts)   fleet.generate → rewards.score, one or more calls
    fleet.sleep(); rl_update(learner, allocation) old log-probs, advantages, optimizer steps (mini-batches)
    runtime.sync_weights()                    the learner's weights become the fleet's next version

with held-out evaluation every ``eval.every_steps`` and a checkpoint every ``checkpoint.every_steps``.
The scheduler decides which prompts get how many rollouts (``scheduler.policy``: ``grpo``, B prompts
x n; ``dapo``; ``pilot_commit``; ``adaptive``: see pc_megatron/scheduler). Departures from the
textbook are in ``algo/update.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from pc_megatron.algo.config import AlgoConfig
from pc_megatron.algo.update import rl_update
from pc_megatron.checkpoint.convert import save_hf_folder
from pc_megatron.config import RunConfig
from pc_megatron.data.task import expected_eval_set
from pc_megatron.evaluate import Evaluation
from pc_megatron.phases import PhaseTimes
from pc_megatron.rollout.fleet import Engines
from pc_megatron.rollout.generate import Rollouts, stream_seed
from pc_megatron.rollout.producer import (
    LEARNER_PHASES,
    InlineProducer,
    Produced,
    ThreadedProducer,
    make_producer,
    staleness_metrics,
)
from pc_megatron.run.folder import RunFolder, checkpoint_step
from pc_megatron.run.logs import RunLogs, summarize
from pc_megatron.run.preemption import RunStopped, record_processes
from pc_megatron.run.setup import Run, open_run
from pc_megatron.run.state import LoopState
from pc_megatron.runtime.roles import Runtime
from pc_megatron.scheduler import Scheduler


def train(cfg: RunConfig, folder: RunFolder | Path, resume: bool = False, capture=None) -> dict:
    """The RL run of ``cfg`` in ``folder`` (a path: a fresh run, or with ``resume`` its continuation),
    driven from this process; ``cfg.runtime`` places the learner and the engines.

    ``capture`` (``pc-megatron profile``): ``capture.step(step)`` is entered around each step;
    a captured run measures steps only (no held-out evaluation, no checkpoint)."""
    if not isinstance(folder, RunFolder):
        folder = RunFolder(Path(folder), resume, checkpoint_step(Path(folder)) if resume else None)
    with open_run(cfg, folder) as run:
        return _loop(run, capture)


def _loop(run: Run, capture) -> dict:
    """The steps of an open run, from its state (step 0, or the checkpoint's) to ``cfg.steps``, with the
    evaluation and checkpoint cadence; the summary at the end."""
    cfg, learner, fleet = run.cfg, run.runtime.learner, run.runtime.fleet
    B, n = cfg.algo.prompts_per_step, cfg.algo.samples_per_prompt
    scheduler = Scheduler(cfg.scheduler, len(run.task.train), B, n, seed=cfg.seed)
    params = cfg.rollout.sampling()
    loss_cfg = dataclasses.replace(cfg.algo.loss, norm_tokens=cfg.algo.loss.norm_tokens or cfg.rollout.max_new_tokens)
    algo = dataclasses.replace(cfg.algo, loss=loss_cfg)
    seeds = lambda s, k: stream_seed(cfg.seed, s, 1 + k)  # noqa: E731
    rollouts = Rollouts(fleet, run.rewards, run.tokenizer, run.task.train, params, seeds)
    run.state.restore(learner, scheduler)
    loop, wall_at_start = run.state.loop, run.state.loop.wall_s
    logs = RunLogs(run.path, run.state.resume_step, run.trackers)  # later rows are redone
    engines = Engines(fleet, cfg.rollout)
    learner.offload()  # the training peak's memory goes back first: the sync wakes the engine's weights
    run.runtime.sync_weights()
    streaming = cfg.scheduler.stream and engines.streams
    version = lambda: engines.weight_version  # noqa: E731
    producer = make_producer(cfg.rollout.max_staleness, scheduler, rollouts, engines.gate, version, streaming)
    parts = Parts(cfg, run.runtime, engines, algo, rollouts, producer, loop)
    run_eval = Evaluation(run, params, engines, logs, loop, expected_eval_set(cfg.data, cfg.eval.expected, run.task))
    if run.state.found is None and capture is None:
        times = PhaseTimes()
        with times("eval"):
            row = {"step": 0, "cum_rollouts": 0, "cum_generated_tokens": 0, **run.task.dropped, **run_eval(0)}
        logs.metrics.write({**row, **times.metrics()})
    steps = range(loop.step + 1, cfg.steps + 1)
    bar = tqdm(steps, cfg.scheduler.policy, initial=loop.step, total=cfg.steps, disable=not cfg.progress)
    producer.start(loop.step + 1, cfg.steps, weights_step=loop.step)
    try:
        for step in bar:
            with capture.step(step) if capture else contextlib.nullcontext():
                every = step % cfg.eval.every_steps == 0 or step == cfg.steps
                eval_now = run_eval if capture is None and every else None
                row, made = _step(parts, step, eval_now)
            logs.metrics.write(row)
            logs.trained.write({"step": step, "epoch": made.allocation.stats["epoch"], "prompts": made.prompts()})
            bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.2f}", acc=f"{loop.last_eval_accuracy:.3f}")
            _cadence(run, step, made, wall_at_start, capture)
    finally:
        producer.close()
        bar.close()
        logs.close()
    run.trackers.flush()
    wall = wall_at_start + time.time() - run.t_start
    return summarize(cfg.steps, cfg.scheduler.policy, run.path, wall, run.trackers.failures)


def _cadence(run: Run, step: int, made: Produced, wall_at_start: float, capture) -> None:
    """After ``step``: a checkpoint when one is due (scheduled, the last step, or a stop signal with
    ``checkpoint.on_signal``), then the stop itself when a signal asked for it."""
    cfg, loop = run.cfg, run.state.loop
    last = step == cfg.steps and capture is None
    stopping = run.stop.signum is not None and capture is None
    scheduled = cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0
    if scheduled or last or (stopping and cfg.checkpoint.on_signal):
        loop.step, loop.wall_s = step, wall_at_start + time.time() - run.t_start
        run.trackers.flush()  # the trackers hold every row to here: a resume starts after this step
        # the scheduler as it was when this step's batch was made: batches made ahead are made again
        ck = cfg.checkpoint
        saved = run.state.save(made.scheduler_state, ck.keep_last, run.policy_dir, run.runtime.learner)
        record_processes(run.path)  # the checkpoint writer's helper starts with the first save
        if ck.save_hf:
            save_hf_folder(saved)
    if stopping and not last:
        raise RunStopped(run.stop.signum, run.path, step, saved=bool(scheduled or cfg.checkpoint.on_signal))


@dataclass
class Parts:
    """What a step works with."""

    cfg: RunConfig
    runtime: Runtime
    engines: Engines
    algo: AlgoConfig
    rollouts: Rollouts
    producer: InlineProducer | ThreadedProducer
    loop: LoopState


def _step(parts: Parts, step: int, eval_now) -> tuple[dict, Produced]:
    """One RL step (``eval_now``: the held-out evaluation, when this step has one): its metrics row, and
    the batch it trained."""
    cfg, runtime, engines, producer, loop = parts.cfg, parts.runtime, parts.engines, parts.producer, parts.loop
    learner, rollouts = runtime.learner, parts.rollouts
    t_step, times = time.perf_counter(), PhaseTimes()
    made = producer.take(step, times)
    allocation = made.allocation
    row = {"step": step, **allocation.metrics(), **made.counters}
    if producer.max_staleness:  # made while earlier steps trained: its phases are not this step's
        row |= {f"time/producer_{k}_s": v for k, v in made.seconds.items()}
    row |= staleness_metrics(allocation.groups, loop.update_versions, learner.version)
    if allocation.groups:
        if not producer.max_staleness:  # colocated engines free the GPU (ahead-made batches need it awake)
            with times("engine_sleep"):
                engines.sleep()
        row |= rl_update(
            learner,
            runtime.ref_learner,
            allocation.groups,
            rollouts.prompt_ids,
            rollouts.tokenizer,
            parts.algo,
            rollouts.params.temperature,
            times,
            min_rows=cfg.learner.data_parallel_size,
        )
        with times("sync"):
            # the learner's training peak (cached blocks; with offload_during_rollout its optimizer state
            # and gradients) is released before the sync wakes the engine's weights and vLLM's runtime pools
            learner.offload()
            row |= engines.sync(step, runtime.sync_weights)
        loop.update_versions.append(learner.version)
        row["engine_weight_version"] = engines.weight_version
    producer.weights_updated(step)
    row["policy_version"] = learner.version
    if eval_now is not None:
        with times("eval"):
            row |= eval_now(step)
    t_end = time.perf_counter()
    row |= {
        "time/learner_busy_s": sum(times.seconds.get(k, 0.0) for k in LEARNER_PHASES),
        "time/engine_busy_s": engines.busy_within(t_step, t_end),
    }
    return {**row, **times.metrics(), "time_step_s": t_end - t_step}, made

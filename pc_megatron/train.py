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
import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from pc_megatron.algo.config import AlgoConfig
from pc_megatron.algo.update import rl_update
from pc_megatron.checkpoint.store import load_latest, save_checkpoint, set_rng_state
from pc_megatron.config import RunConfig, leaf_values, to_yaml
from pc_megatron.data.task import Task, expected_eval_set
from pc_megatron.evaluate import evaluate, evaluate_sets, expected_accuracy
from pc_megatron.files import atomic_write_text, claim_run_dir
from pc_megatron.fingerprint import check_resume, run_fingerprint
from pc_megatron.observability import MetricsLog, StepLog, summarize
from pc_megatron.phases import PhaseTimes
from pc_megatron.preemption import RunStopped, StopRequests, record_processes
from pc_megatron.prepare import prepare_run
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.rollout.generate import Rollouts
from pc_megatron.rollout.producer import (
    LEARNER_PHASES,
    EngineGate,
    InlineProducer,
    Produced,
    ThreadedProducer,
    staleness_metrics,
)
from pc_megatron.runtime.resources import resolve_run, resolved_header
from pc_megatron.runtime.roles import Runtime, build_runtime
from pc_megatron.scheduler import Scheduler
from pc_megatron.trackers import Trackers, check_trackers


def stream_seed(seed: int, step: int, stream: int) -> int:
    """Seed of random stream ``stream`` at ``step`` (0 = evaluation, 1 + k = the step's k-th
    generate call): distinct for every (seed, step, stream), however many calls a step makes."""
    digest = hashlib.blake2b(f"{seed}/{step}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1)


@dataclass
class LoopState:
    """What the loop itself carries across a checkpoint (the parts own the rest)."""

    step: int = 0
    wall_s: float = 0.0
    last_eval_accuracy: float = float("nan")
    update_versions: list[int] = field(default_factory=list)
    """The learner's version after each update so far: a sample's staleness is how many of them lie
    between its weights and the ones it trains (``rollout.producer.staleness_metrics``)."""


@dataclass
class Resumed:
    """What ``train`` read before the runtime started: the checkpoint to resume (``(state, folder)``
    or None) and the run's inputs as checked against it."""

    found: tuple[dict, Path] | None
    fingerprint: dict[str, Any]


def train(
    cfg: RunConfig, run_dir: Path, resume: bool = False, capture=None, on_resume: Callable[[], None] | None = None
) -> dict:
    """The RL run, driven from this process; ``runtime`` places the learner and the engines.
    ``on_resume``: called once a resume is accepted (the folder held, the checkpoint's inputs the same).

    ``capture`` (``pc-megatron profile``): ``capture.step(step)`` is entered around each step;
    a captured run measures steps only (no held-out evaluation, no checkpoint)."""
    t_start = time.time()
    given = cfg
    cfg, resolved = resolve_run(cfg)  # learner.bf16 and threads: auto, for this machine and placement
    for line in resolved.lines():
        print(line, flush=True)
    torch.set_num_threads(cfg.threads)
    # everything that can be checked from the config, the data and the model's config.json, before
    # a run folder exists or a process starts
    prepared = prepare_run(cfg, progress=cfg.progress)
    task, policy_dir, tokenizer = prepared.task, prepared.policy_dir, prepared.tokenizer
    preflight(cfg, policy_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        # the folder is this run's until it ends, however it ends (a kill lets go of the lock too)
        stack.enter_context(contextlib.closing(claim_run_dir(run_dir)))
        # the checkpoint first: a resume on other inputs stops before a file changes or a process starts
        found = load_latest(run_dir / "checkpoints") if resume else None
        fingerprint = run_fingerprint(cfg, task, tokenizer)
        if found is not None:
            check_resume(found[0].get("fingerprint"), fingerprint, str(found[1]))
        if resume and on_resume is not None:
            on_resume()
        atomic_write_text(run_dir / "config.yaml", resolved_header(given, resolved) + to_yaml(given))
        if any(task.dropped.values()):
            dropped = f"prompts over data.max_prompt_tokens={cfg.data.max_prompt_tokens}, left out: {task.dropped}"
            print(dropped, flush=True)
        resume_step = found[0]["loop"]["step"] if found is not None else -1
        trackers = Trackers(
            cfg.loggers, run_dir, leaf_values(given) | resolved.params(), resume_step
        )  # before any process starts
        stack.push(lambda kind, _e, _tb: trackers.close(_tracker_status(kind)))
        stop = stack.enter_context(StopRequests())
        rewards = stack.enter_context(RewardPool(cfg.reward))
        runtime = build_runtime(
            cfg.runtime,
            cfg.learner,
            cfg.rollout,
            cfg.ray,
            policy_dir,
            run_dir,
            cfg.seed,
            resolved.threads,
            reference=cfg.algo.loss.kl_coef > 0,
        )
        stack.callback(runtime.close)
        print(read_back_dtypes(runtime), flush=True)
        record_processes(run_dir)
        resumed = Resumed(found, fingerprint)
        return _run(
            cfg, run_dir, resumed, task, policy_dir, tokenizer, rewards, runtime, trackers, t_start, capture, stop
        )


def read_back_dtypes(runtime: Runtime) -> str:
    """One line: the dtypes the learner's parameters and the engine hold, asked of them (not the config)."""
    counts = runtime.learner.param_dtypes()
    total = sum(counts.values()) or 1
    shares = ", ".join(
        f"{k.removeprefix('torch.')} {v / total:.1%}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
    )
    return (
        f"dtypes read back: learner parameters {shares}; engine {runtime.fleet.served_dtype().removeprefix('torch.')}"
    )


def _tracker_status(kind: type | None) -> str:
    """How a tracker run ends: FINISHED, KILLED (a signal stopped it; it resumes) or FAILED."""
    if kind is None:
        return "FINISHED"
    return "KILLED" if issubclass(kind, (RunStopped, KeyboardInterrupt)) else "FAILED"


def preflight(cfg: RunConfig, policy_dir: Path) -> None:
    """What can fail before any process starts, checked first: the learner's layout against the
    model's config.json (heads, KV heads, FFN, vocabulary, layers) and the runtime, and a cluster
    address that must answer."""
    from pc_megatron.errors import ConfigError
    from pc_megatron.model.arch import load_arch
    from pc_megatron.weight_sync.sharding import check_divisible

    lc = cfg.learner
    check_divisible(load_arch(policy_dir), lc.tensor_parallel_size, lc.pipeline_parallel_size)
    check_trackers(cfg.loggers)
    world = lc.tensor_parallel_size * lc.pipeline_parallel_size * lc.data_parallel_size
    if cfg.runtime == "local" and world > 1:
        raise ConfigError(f"learner TP x PP x DP = {world} ranks need runtime=ray (runtime=local is one process)")
    if cfg.runtime == "local" and cfg.rollout.backend == "vllm":  # the engine's workers and their one route
        from pc_megatron.weight_sync.routes import Slot, plan_routes

        workers = [Slot("local", w) for w in range(cfg.rollout.vllm.tensor_parallel_size)]
        plan_routes(
            [Slot("local", 0)],
            [workers],
            on_gpu=torch.cuda.is_available(),
            placement="colocated",
            transport=cfg.rollout.weight_sync.transport,
            runtime="local",
            engine="vllm",
        )
    if cfg.runtime == "ray" and cfg.ray.address:
        from pc_megatron.runtime.ray_cluster import check_join_token, check_reachable

        check_reachable(cfg.ray.address, cfg.ray.connect_timeout_s)
        check_join_token(cfg.ray.address)


def _run(
    cfg: RunConfig,
    run_dir: Path,
    resumed: Resumed,
    task: Task,
    policy_dir: Path,
    tokenizer,
    rewards: RewardPool,
    runtime: Runtime,
    trackers: Trackers,
    t_start: float,
    capture,
    stop: StopRequests,
) -> dict:
    learner, fleet = runtime.learner, runtime.fleet
    B, n = cfg.algo.prompts_per_step, cfg.algo.samples_per_prompt
    scheduler = Scheduler(cfg.scheduler, len(task.train), B, n, seed=cfg.seed)
    params = cfg.rollout.sampling()
    loss_cfg = dataclasses.replace(cfg.algo.loss, norm_tokens=cfg.algo.loss.norm_tokens or cfg.rollout.max_new_tokens)
    algo = dataclasses.replace(cfg.algo, loss=loss_cfg)
    rollouts = Rollouts(fleet, rewards, tokenizer, task.train, params, lambda s, k: stream_seed(cfg.seed, s, 1 + k))
    loop = LoopState()
    found, fingerprint = resumed.found, resumed.fingerprint
    if found is not None:
        state, path = found
        learner.load(path / "learner")
        scheduler.load_state_dict(state["scheduler"])
        loop = LoopState(**state["loop"])
        set_rng_state(state["rng"])
    wall_at_start = loop.wall_s
    metrics = MetricsLog(run_dir, loop.step if found else -1, trackers)  # later rows are redone
    trained = StepLog(run_dir / "trained.jsonl", resume_step=loop.step if found else -1)
    samples_log = StepLog(run_dir / "samples.jsonl", resume_step=loop.step if found else -1)
    gate = EngineGate(cfg.rollout.timeout_s)
    learner.offload()  # the training peak's memory goes back first: the sync wakes the engine's weights
    runtime.sync_weights()
    streaming = cfg.scheduler.stream and getattr(fleet, "streams", False)
    producer = make_producer(
        cfg.rollout.max_staleness, scheduler, rollouts, gate, lambda: fleet.weight_version, streaming
    )

    expected_rows = expected_eval_set(cfg.data, cfg.eval.expected, task)

    def run_eval(step: int) -> dict[str, float]:
        seed = stream_seed(cfg.seed, step, 0)
        shown: list[dict] = []  # a few prompts' completions, read beside the curves (eval.log_samples)
        with gate.hold(f"the held-out evaluation at step {step}", generating=True):
            out = evaluate(fleet, tokenizer, task.eval, cfg.eval, rewards, params, seed, shown) if task.eval else {}
            if task.sets:
                sets = evaluate_sets(fleet, tokenizer, task.sets, cfg.eval, rewards, params, seed, shown)
                for key in ("eval/reward_timeouts", "eval/reward_errors"):  # counted over every evaluation call
                    sets[key] += out.get(key, 0)
                out |= sets
                out.setdefault("eval_accuracy", out["eval/mean"])
        if expected_rows:
            mix = dict(cfg.data.synthetic.mix)
            out |= expected_accuracy(learner, tokenizer, expected_rows, params.temperature, mix)
        for sample in shown:
            samples_log.write({"step": step, **sample})
        trackers.samples(step, shown)
        loop.last_eval_accuracy = out["eval_accuracy"]
        return out

    if found is None and capture is None:
        times = PhaseTimes()
        with times("eval"):
            row = {"step": 0, "cum_rollouts": 0, "cum_generated_tokens": 0, **task.dropped, **run_eval(0)}
        metrics.write({**row, **times.metrics()})
    steps = range(loop.step + 1, cfg.steps + 1)
    bar = tqdm(steps, cfg.scheduler.policy, initial=loop.step, total=cfg.steps, disable=not cfg.progress)
    producer.start(loop.step + 1, cfg.steps, weights_step=loop.step)
    try:
        for step in bar:
            with capture.step(step) if capture else contextlib.nullcontext():
                every = step % cfg.eval.every_steps == 0 or step == cfg.steps
                eval_now = run_eval if capture is None and every else None
                row, made = _step(cfg, step, producer, runtime, gate, algo, rollouts, loop, eval_now)
            metrics.write(row)
            trained.write({"step": step, "epoch": made.allocation.stats["epoch"], "prompts": made.prompts()})
            bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.2f}", acc=f"{loop.last_eval_accuracy:.3f}")
            last = step == cfg.steps and capture is None
            stopping = stop.signum is not None and capture is None
            scheduled = cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0
            if scheduled or last or (stopping and cfg.checkpoint.on_signal):
                loop.step, loop.wall_s = step, wall_at_start + time.time() - t_start
                # the scheduler as it was when this step's batch was made: batches made ahead are made again
                state = {"scheduler": made.scheduler_state, "loop": asdict(loop), "fingerprint": fingerprint}
                trackers.flush()  # the trackers hold every row to here: a resume starts after this step
                saved = save_checkpoint(
                    run_dir / "checkpoints", step, state, cfg.checkpoint.keep_last, policy_dir, learner
                )
                record_processes(run_dir)  # the checkpoint writer's helper starts with the first save
                if cfg.checkpoint.save_hf:
                    save_hf_folder(saved)
            if stopping and not last:
                raise RunStopped(stop.signum, run_dir, step, saved=bool(scheduled or cfg.checkpoint.on_signal))
    finally:
        producer.close()
        bar.close()
        metrics.close()
        trained.close()
        samples_log.close()
    trackers.flush()
    wall = wall_at_start + time.time() - t_start
    return summarize(cfg.steps, cfg.scheduler.policy, run_dir, wall, trackers.failures)


def save_hf_folder(checkpoint: Path) -> Path:
    """The checkpoint as a Hugging Face folder in ``checkpoint/huggingface`` (the conversion of
    ``pc-megatron convert --to hf``: any layout, one layer in memory at a time, written to a temporary
    folder and renamed, so a kill leaves none half-written)."""
    from pc_megatron.checkpoint.convert import megatron_to_hf_folder

    out = checkpoint / "huggingface"
    if not out.exists():  # a resume that saves the same step again keeps the one there
        megatron_to_hf_folder(checkpoint, out, log=lambda *_: None)
    return out


def make_producer(
    max_staleness: int, scheduler: Scheduler, rollouts: Rollouts, gate: EngineGate, version, streaming: bool
) -> InlineProducer | ThreadedProducer:
    """The producer of the loop's batches: made in the loop at η = 0, ahead in a thread at η >= 1."""
    if max_staleness == 0:
        return InlineProducer(scheduler, rollouts, gate, version, streaming)
    return ThreadedProducer(scheduler, rollouts, gate, version, max_staleness, gate.timeout_s, streaming)


def _step(
    cfg: RunConfig,
    step: int,
    producer: InlineProducer | ThreadedProducer,
    runtime: Runtime,
    gate: EngineGate,
    algo: AlgoConfig,
    rollouts: Rollouts,
    loop: LoopState,
    eval_now,
) -> tuple[dict, Produced]:
    """One RL step (``eval_now``: the held-out evaluation, when this step has one): its metrics row, and
    the batch it trained."""
    learner, fleet = runtime.learner, runtime.fleet
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
                fleet.sleep()
        row |= rl_update(
            learner,
            runtime.ref_learner,
            allocation.groups,
            rollouts.prompt_ids,
            rollouts.tokenizer,
            algo,
            rollouts.params.temperature,
            times,
            min_rows=cfg.learner.data_parallel_size,
        )
        with times("sync"):
            # the learner's training peak (cached blocks; with offload_during_rollout its optimizer state
            # and gradients) is released before the sync wakes the engine's weights and vLLM's runtime pools
            learner.offload()
            if cfg.rollout.inflight == "keep":  # the engine takes it mid-call, pausing and keeping its requests
                row |= runtime.sync_weights()
            else:
                with gate.hold(f"the weight sync after step {step}"):  # drain: after the call in flight
                    row |= runtime.sync_weights()
        loop.update_versions.append(learner.version)
        row["engine_weight_version"] = fleet.weight_version
    producer.weights_updated(step)
    row["policy_version"] = learner.version
    if eval_now is not None:
        with times("eval"):
            row |= eval_now(step)
    t_end = time.perf_counter()
    row |= {
        "time/learner_busy_s": sum(times.seconds.get(k, 0.0) for k in LEARNER_PHASES),
        "time/engine_busy_s": gate.busy_within(t_step, t_end),
    }
    return {**row, **times.metrics(), "time_step_s": t_end - t_step}, made

"""RL training loop. The scheduler decides which prompts get how many rollouts (``grpo``:
B prompts x n; ``dapo``; ``pilot_commit``: see pc_megatron/scheduler), then one update.

Per step (learner and rollout fleet are roles that ``pc_megatron/runtime`` places in this
process or on Ray actors): the scheduler asks the fleet for completions (one or more calls; each
sample is tagged with the weight version the engine served) → verify rewards → the engine sleeps
(colocated GPU) and the learner recomputes old log-probs (we log their mismatch with the
engine's sampling log-probs: with correct weight sync this is float noise) → group advantages →
one clipped surrogate update → the new weights stream to the engine in memory, checked against
its manifest, and become the engine's next version. Held-out accuracy every
``eval.every_steps``; a checkpoint every ``checkpoint.every_steps``.

Departures from the textbook: old log-probs come from the learner, not the engine (standard in
verl/slime); one optimizer step per batch of rollouts, so the ratio is 1 at the start of the
update and the clip matters only with several mini-batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from pc_megatron.algo.advantages import group_advantages
from pc_megatron.checkpoint import load_latest, save_checkpoint, set_rng_state
from pc_megatron.data.task import prepare_task
from pc_megatron.evaluate import evaluate
from pc_megatron.model.tiny import load_tokenizer
from pc_megatron.observability import MetricsLog, eval_curve, format_table, plot_accuracy, read_metrics
from pc_megatron.pools import select_pool
from pc_megatron.rewards import build_reward, score_all
from pc_megatron.rollout.batch import completions_to_batch, group_stats, logprob_mismatch
from pc_megatron.runtime import build_runtime
from pc_megatron.scheduler import GenRequest, Group, Sample, Scheduler
from pc_megatron.warmstart import ensure_warm_start


def _seed(cfg: Any, step: int, stream: int) -> int:
    return (cfg.seed * 1_000_003 + step) * 16 + stream


@contextlib.contextmanager
def timed(times: dict[str, float], phase: str):
    """Accumulate the wall time of a phase into ``times["time_<phase>_s"]``."""
    t0 = time.perf_counter()
    yield
    key = f"time_{phase}_s"
    times[key] = times.get(key, 0.0) + time.perf_counter() - t0


def train(cfg: Any, run_dir: Path, resume: bool = False) -> dict:
    """The RL run, driven from this process; ``runtime`` places the learner and the engines."""
    t_start = time.time()
    torch.set_num_threads(cfg.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))

    task = prepare_task(cfg)
    policy_dir = ensure_warm_start(cfg, task, progress=cfg.progress)
    task = select_pool(cfg, task, policy_dir, progress=cfg.progress)
    tokenizer = load_tokenizer(policy_dir)
    reward = build_reward(cfg.reward)
    runtime = build_runtime(cfg, policy_dir, run_dir)
    learner, ref_learner, engine = runtime.learner, runtime.ref_learner, runtime.fleet
    try:
        B, n = cfg.algo.prompts_per_step, cfg.algo.samples_per_prompt
        scheduler = Scheduler(OmegaConf.to_object(cfg.scheduler), len(task.train), B, n, seed=cfg.seed)
        sampling = OmegaConf.to_object(cfg.rollout).sampling()
        loss_cfg = OmegaConf.to_object(cfg.algo.loss)

        loop = {"step": 0, "cum_generated_tokens": 0, "last_eval_accuracy": float("nan"), "wall_s": 0.0}
        found = load_latest(run_dir / "checkpoints") if resume else None
        state = found[0] if found else None
        if found is not None:
            learner.load(found[1] / "learner")
            scheduler.load_state_dict(state["scheduler"])
            loop = state["loop"]
            set_rng_state(state["rng"])
        wall_at_start = loop["wall_s"]
        # Rows past the checkpoint (or all rows, without one) are redone, so they are dropped first.
        metrics = MetricsLog(run_dir, resume_step=loop["step"] if state is not None else -1)
        runtime.sync_weights()
        learner.offload()

        def run_eval(step: int) -> dict:
            acc, per_family = evaluate(
                engine,
                tokenizer,
                task.eval,
                cfg.eval,
                reward,
                cfg.rollout.max_new_tokens,
                _seed(cfg, step, 1),
                cfg.reward.timeout_s,
            )
            loop["last_eval_accuracy"] = acc
            return {"eval_accuracy": acc, **{f"eval_accuracy/{k}": v for k, v in per_family.items()}}

        def checkpoint(step: int) -> None:
            loop["step"] = step
            loop["wall_s"] = wall_at_start + time.time() - t_start
            state = {"scheduler": scheduler.state_dict(), "loop": loop}
            save_checkpoint(
                run_dir / "checkpoints", step, state, cfg.checkpoint.keep_last, hf_side=policy_dir, learner=learner
            )

        if state is None:
            t0 = time.perf_counter()
            row = {"step": 0, "cum_rollouts": 0, "cum_generated_tokens": 0, **run_eval(0)}
            metrics.write({**row, "time_eval_s": time.perf_counter() - t0})

        bar = tqdm(
            range(loop["step"] + 1, cfg.steps + 1),
            desc=cfg.scheduler.policy,
            initial=loop["step"],
            total=cfg.steps,
            disable=not cfg.progress,
            dynamic_ncols=True,
        )

        def update_policy(groups: list[Group], times: dict[str, float]) -> dict:
            """Old log-probs, advantages over each group, one optimizer step, weight sync."""
            prompts = [prompt_ids[g.prompt] for g in groups]
            samples = [s for g in groups for s in g.samples]
            completions = [
                dataclasses.replace(s.payload, prompt_index=i) for i, g in enumerate(groups) for s in g.samples
            ]
            rewards = torch.tensor([s.reward for s in samples])
            correct = torch.tensor([s.correct for s in samples])
            group_ids = torch.cat([torch.full((len(g.samples),), i) for i, g in enumerate(groups)])
            with timed(times, "logprob"):
                engine.sleep()
                batch, engine_logp = completions_to_batch(prompts, completions, tokenizer.pad_token_id)
                old_logp = learner.logprobs(batch, sampling.temperature)
                ref_logp = ref_learner.logprobs(batch, sampling.temperature) if ref_learner else None
            # Learner/engine agreement, on rollouts the engine sampled with the learner's current
            # weights (stale pilot rollouts came from an older policy and differ by design).
            version = learner.version
            fresh = torch.tensor([s.policy_version == version for s in samples], dtype=torch.float32)
            mismatch_mean, mismatch_max = logprob_mismatch(old_logp, engine_logp, batch.loss_mask * fresh[:, None])
            tis = {}
            is_weight = None
            if loss_cfg.tis_cap > 0:  # truncated IS from the behaviour policy (the engine at sampling time)
                raw = torch.exp(old_logp - engine_logp)
                is_weight = raw.clamp(max=loss_cfg.tis_cap)
                n_tok = max(float(batch.loss_mask.sum()), 1.0)
                tis = {
                    "tis_weight_mean": float((is_weight * batch.loss_mask).sum()) / n_tok,
                    "tis_truncated_frac": float(((raw > loss_cfg.tis_cap) * batch.loss_mask).sum()) / n_tok,
                }
            with timed(times, "train"):
                adv = group_advantages(rewards, group_ids, loss_cfg.normalize_adv_by_std)
                stats = learner.train_rl(batch, old_logp, adv, loss_cfg, sampling.temperature, ref_logp, is_weight)
            with timed(times, "sync"):
                sync = runtime.sync_weights()
                learner.offload()
            n_tokens = int(batch.loss_mask.sum())
            return {
                "trained_groups": len(groups),
                "reward_mean": float(rewards.mean()),
                "accuracy": float(correct.float().mean()),
                **group_stats(correct, rewards, n),
                "response_len_mean": n_tokens / len(completions),
                "frac_truncated": sum(c.finish_reason == "length" for c in completions) / len(completions),
                "logprob_mismatch": mismatch_mean,
                "logprob_mismatch_max": mismatch_max,
                **sync,
                "engine_weight_version": engine.weight_version,
                **tis,
                **stats,
            }

        prompt_ids = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in task.train]

        def engine_generate(step: int, times: dict, calls: list, requests: list[GenRequest]) -> list[list[Sample]]:
            """One engine call for the scheduler: completions → rewards → Samples. Appends
            (requests, generated tokens) to ``calls``."""
            with timed(times, "rollout"):
                completions = engine.generate(
                    [prompt_ids[r.prompt] for r in requests],
                    [r.n for r in requests],
                    sampling,
                    _seed(cfg, step, 2 + len(calls)),
                )
            with timed(times, "reward"):
                texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
                rows = [task.train[requests[c.prompt_index].prompt] for c in completions]
                results = score_all(reward, texts, [r.answer for r in rows], [r.id for r in rows], cfg.reward.timeout_s)
            calls.append((len(requests), sum(len(c.token_ids) for c in completions)))
            samples = [
                Sample(r.correct, r.score, c.weight_version, c, len(c.token_ids))
                for r, c in zip(results, completions, strict=True)
            ]
            bounds = [0, *itertools.accumulate(r.n for r in requests)]
            return [samples[a:b] for a, b in itertools.pairwise(bounds)]

        for step in bar:
            times: dict[str, float] = {}
            calls: list[tuple[int, int]] = []
            t_step = time.perf_counter()
            generate = functools.partial(engine_generate, step, times, calls)
            t_sched = time.perf_counter()
            plan = scheduler.next_batch(step, generate, policy_version=learner.version)
            # the scheduler's own time: its decisions, without the engine and reward calls it made
            times["time_scheduler_s"] = (
                time.perf_counter() - t_sched - times.get("time_rollout_s", 0.0) - times.get("time_reward_s", 0.0)
            )
            loop["cum_generated_tokens"] += sum(tokens for _, tokens in calls)
            row = {
                "step": step,
                "cum_rollouts": scheduler.counts["generated"],
                "cum_generated_tokens": loop["cum_generated_tokens"],
                "generate_calls": len(calls),
                **{f"sched/{k}": v for k, v in plan.stats.items()},
            }
            if plan.groups:
                row.update(update_policy(plan.groups, times))
            row["policy_version"] = learner.version
            if step % cfg.eval.every_steps == 0 or step == cfg.steps:
                with timed(times, "eval"):
                    row.update(run_eval(step))
            row.update(times)
            row["time_step_s"] = time.perf_counter() - t_step
            metrics.write(row)
            bar.set_postfix(
                reward=f"{row.get('reward_mean', float('nan')):.2f}", acc=f"{loop['last_eval_accuracy']:.3f}"
            )
            if (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or step == cfg.steps:
                checkpoint(step)
        bar.close()
        metrics.close()
        return finish(cfg, run_dir, loop, wall_at_start + time.time() - t_start)
    finally:
        runtime.close()


def finish(cfg: Any, run_dir: Path, loop: dict, wall_s: float) -> dict:
    rows = read_metrics(run_dir)
    evals = [r for r in rows if "eval_accuracy" in r]
    steps = [r for r in rows if "time_step_s" in r]
    phases = sorted({k for r in steps for k in r if k.startswith("time_") and k != "time_step_s"})
    summary = {
        "steps": cfg.steps,
        "initial_eval_accuracy": evals[0]["eval_accuracy"],
        "final_eval_accuracy": evals[-1]["eval_accuracy"],
        "best_eval_accuracy": max(r["eval_accuracy"] for r in evals),
        "cum_rollouts": rows[-1]["cum_rollouts"],
        "cum_generated_tokens": loop["cum_generated_tokens"],
        "max_logprob_mismatch": max((r.get("logprob_mismatch_max", 0.0) for r in steps), default=0.0),
        "mean_step_s": sum(r["time_step_s"] for r in steps) / max(len(steps), 1),
        "phase_s": {p: sum(r.get(p, 0.0) for r in steps) for p in phases},
        "wall_s": wall_s,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_accuracy({"GRPO": eval_curve(rows)}, run_dir / "eval_accuracy.png")
    table = [
        ("run directory", str(run_dir)),
        ("steps", str(cfg.steps)),
        (
            "held-out accuracy",
            f"{summary['initial_eval_accuracy']:.3f} -> {summary['final_eval_accuracy']:.3f} "
            f"(best {summary['best_eval_accuracy']:.3f})",
        ),
        ("cumulative rollouts", f"{summary['cum_rollouts']:,}"),
        ("generated tokens", f"{summary['cum_generated_tokens']:,}"),
        ("max log-prob mismatch", f"{summary['max_logprob_mismatch']:.2e}"),
        ("mean step time", f"{summary['mean_step_s']:.3f} s"),
        *((p[5:-2], f"{v:.1f} s") for p, v in summary["phase_s"].items()),
        ("wall time", f"{wall_s:.1f} s"),
    ]
    print(format_table(table))
    return summary

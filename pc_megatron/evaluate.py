"""Held-out evaluation: mean accuracy over k samples per prompt, overall and per family; and the
exact expected accuracy at the sampling temperature (teacher-forced, from the learner)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pc_megatron.data.dataset import PromptRow
from pc_megatron.rewards.pool import RewardPool
from pc_megatron.rollout.base import RolloutEngine
from pc_megatron.rollout.config import SamplingParams
from pc_megatron.rollout.generate import encode_prompts, generate_and_score, stream_seed

if TYPE_CHECKING:
    from pc_megatron.config import EvalConfig, EvalSetConfig
    from pc_megatron.rollout.fleet import Engines
    from pc_megatron.run.logs import RunLogs
    from pc_megatron.run.setup import Run
    from pc_megatron.run.state import LoopState


def evaluate(
    fleet: RolloutEngine,
    tokenizer,
    rows: list[PromptRow],
    cfg: EvalConfig,
    rewards: RewardPool,
    rollout_params: SamplingParams,
    seed: int,
    samples: list[dict] | None = None,
) -> dict[str, float]:
    """``eval_accuracy`` and ``eval_accuracy/<family>`` over ``cfg.num_prompts`` held-out rows
    (0 = all), ``cfg.samples_per_prompt`` each, at ``cfg.temperature`` (top-p 1); length and
    stop tokens as in training unless ``cfg.max_new_tokens`` is set. ``samples``: the first
    ``cfg.log_samples`` prompts' first completions are appended to it (``sample_rows``)."""
    if cfg.num_prompts:
        rows = rows[: cfg.num_prompts]
    params = dataclasses.replace(
        rollout_params,
        temperature=cfg.temperature,
        top_p=1.0,
        max_new_tokens=cfg.max_new_tokens or rollout_params.max_new_tokens,
    )
    shown = (samples, "heldout", cfg.log_samples)
    acc, by_family, extra = _accuracy(fleet, tokenizer, rewards, rows, cfg.samples_per_prompt, params, seed, shown)
    return {"eval_accuracy": acc, **{f"eval_accuracy/{f}": v for f, v in by_family.items()}, **extra}


def evaluate_sets(
    fleet: RolloutEngine,
    tokenizer,
    sets: list[tuple[str, list[PromptRow], EvalSetConfig]],
    cfg: EvalConfig,
    rewards: RewardPool,
    rollout_params: SamplingParams,
    seed: int,
    samples: list[dict] | None = None,
) -> dict[str, float]:
    """``eval/<name>`` (avg@repeats over the set, at its own sampling) for each ``(name, rows,
    EvalSetConfig)``, and ``eval/mean``, their unweighted mean (each benchmark counts once).
    ``samples``: as in ``evaluate``, for each set."""
    out: dict[str, float] = {}
    failures = {"eval/reward_timeouts": 0, "eval/reward_errors": 0}
    for name, rows, s in sets:
        params = dataclasses.replace(
            rollout_params,
            temperature=cfg.temperature if s.temperature is None else s.temperature,
            top_p=s.top_p,
            max_new_tokens=s.max_new_tokens or cfg.max_new_tokens or rollout_params.max_new_tokens,
        )
        shown = (samples, name, cfg.log_samples)
        out[f"eval/{name}"], _, extra = _accuracy(fleet, tokenizer, rewards, rows, s.repeats, params, seed, shown)
        for key in failures:
            failures[key] += extra[key]
    out["eval/mean"] = sum(out.values()) / len(out)
    out |= failures
    return out


def _accuracy(fleet, tokenizer, rewards, rows, k: int, params, seed: int, shown=(None, "", 0)):
    """Mean correctness over ``k`` samples of each row, overall and per ``meta["family"]``; and what
    else the call shows: the reward pool's ``eval/reward_timeouts`` and ``eval/reward_errors``, and with
    ``math_verify`` the share of answers that were boxed at all (``eval_boxed_frac``: a wrong format
    and a wrong answer both score as wrong). ``shown``: ``(list, set name, count)`` for ``sample_rows``."""
    completions, scored = generate_and_score(
        fleet, tokenizer, rewards, rows, encode_prompts(tokenizer, rows), k, params, seed
    )
    out, name, count = shown
    if out is not None and count:
        out.extend(sample_rows(tokenizer, rewards.cfg.name, rows, completions, scored.results, name, count))
    by_family: dict[str, list[float]] = defaultdict(list)
    for c, res in zip(completions, scored.results, strict=True):
        by_family[str(rows[c.prompt_index].meta.get("family", "all"))].append(float(res.correct))
    acc = sum(float(r.correct) for r in scored.results) / len(scored.results)
    extra = {"eval/reward_timeouts": scored.timeouts, "eval/reward_errors": scored.errors}
    if rewards.cfg.name == "math_verify":
        from pc_megatron.rewards.math import last_boxed

        texts = tokenizer.batch_decode([c.token_ids for c in completions], skip_special_tokens=True)
        extra["eval_boxed_frac"] = sum(last_boxed(t) is not None for t in texts) / len(texts)
    return acc, {f: sum(v) / len(v) for f, v in sorted(by_family.items())}, extra


def extracted_answer(reward: str, text: str) -> str | None:
    """The answer a built-in reward reads in ``text``: the last ``\\boxed{}`` (``math_verify``), the
    integer (``integer_match``); None for a reward function of the user's own."""
    if reward == "math_verify":
        from pc_megatron.rewards.math import last_boxed

        return last_boxed(text)
    if reward == "integer_match":
        from pc_megatron.rewards import IntegerMatchReward

        return IntegerMatchReward.extract(text)
    return None


def sample_rows(tokenizer, reward: str, rows, completions, results, name: str, count: int) -> list[dict]:
    """The first completion of each of the first ``count`` prompts: what a user reads beside the curves."""
    first: dict[int, int] = {}
    for i, c in enumerate(completions):
        if c.prompt_index < count:
            first.setdefault(c.prompt_index, i)
    out = []
    for p, i in sorted(first.items()):
        c, res, row = completions[i], results[i], rows[p]
        text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
        out.append(
            {
                "set": name,
                "id": row.id,
                "prompt": row.prompt,
                "completion": text,
                "extracted": extracted_answer(reward, text),
                "answer": row.answer,
                "reward": res.score,
                "correct": bool(res.correct),
                "finish_reason": c.finish_reason,
            }
        )
    return out


def expected_accuracy(
    learner, tokenizer, rows: list[PromptRow], temperature: float, weights: dict[str, float] | None = None
) -> dict[str, float]:
    """``eval_expected_accuracy`` (and per family): P(answer + EOS | prompt) at ``temperature``,
    one forward pass of the learner (a ``LearnerRole``); with the exact-match reward, the
    probability that a sample at that temperature (no top-p) is correct, up to other correct
    spellings. With ``weights`` (family -> share, e.g. the task's mix) the overall figure is the
    weighted mean of the family means (a stratified estimate: the population of the mix even
    where the set over- or under-represents a family), else the plain mean."""
    from pc_megatron.batch import sft_batch

    batch = sft_batch(tokenizer, rows)
    p = (learner.logprobs(batch, temperature) * batch.loss_mask).sum(1).exp().tolist()
    by_family: dict[str, list[float]] = defaultdict(list)
    for row, v in zip(rows, p, strict=True):
        by_family[str(row.meta.get("family", "all"))].append(v)
    means = {f: sum(v) / len(v) for f, v in sorted(by_family.items())}
    if weights:
        total = sum(weights.get(f, 0.0) for f in means)
        overall = sum(weights.get(f, 0.0) * m for f, m in means.items()) / total
    else:
        overall = sum(p) / len(p)
    return {"eval_expected_accuracy": overall, **{f"eval_expected_accuracy/{f}": m for f, m in means.items()}}


@dataclass
class Evaluation:
    """The held-out evaluation of a run's step (``train.py`` calls it on its cadence), holding the engines
    (``engines``' gate) while it generates; its samples go to the run's logs, its accuracy to the loop's state."""

    run: Run
    params: SamplingParams
    engines: Engines
    logs: RunLogs
    loop: LoopState
    expected_rows: list[PromptRow]

    def __call__(self, step: int) -> dict[str, float]:
        run, cfg, fleet = self.run, self.run.cfg, self.engines.fleet
        seed = stream_seed(cfg.seed, step, 0)
        shown: list[dict] = []  # a few prompts' completions, read beside the curves (eval.log_samples)
        task, tok, rewards = run.task, run.tokenizer, run.rewards
        with self.engines.hold(f"the held-out evaluation at step {step}", generating=True):
            out = evaluate(fleet, tok, task.eval, cfg.eval, rewards, self.params, seed, shown) if task.eval else {}
            if task.sets:
                sets = evaluate_sets(fleet, tok, task.sets, cfg.eval, rewards, self.params, seed, shown)
                for key in ("eval/reward_timeouts", "eval/reward_errors"):  # counted over every evaluation call
                    sets[key] += out.get(key, 0)
                out |= sets
                out.setdefault("eval_accuracy", out["eval/mean"])
        if self.expected_rows:
            mix = dict(cfg.data.synthetic.mix)
            out |= expected_accuracy(run.runtime.learner, tok, self.expected_rows, self.params.temperature, mix)
        self.logs.shown(step, shown)
        self.loop.last_eval_accuracy = out["eval_accuracy"]
        return out

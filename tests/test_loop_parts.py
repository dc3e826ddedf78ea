"""Parts of the training loop that carry its bookkeeping: seed streams, phase timing, the run
summary, and evaluation's sampling settings."""

from __future__ import annotations

import json
import time

from pc_megatron import observability
from pc_megatron.config import load_config
from pc_megatron.rollout.worker import PhaseTimes
from pc_megatron.train import stream_seed


def test_seed_streams_never_collide_however_many_calls_a_step_makes():
    seeds = {stream_seed(s, step, k) for s in (0, 1) for step in range(60) for k in range(40)}
    assert len(seeds) == 2 * 60 * 40
    assert stream_seed(0, 3, 2) == stream_seed(0, 3, 2)  # deterministic, so a resumed run redraws the same


def test_phase_times_are_exclusive():
    times = PhaseTimes()
    with times("outer"):
        time.sleep(0.05)
        with times("inner"):
            time.sleep(0.1)
    assert 0.04 < times.seconds["outer"] < 0.09 and times.seconds["inner"] >= 0.1
    assert set(times.metrics()) == {"time_outer_s", "time_inner_s"}


def test_the_accuracy_plot_is_labelled_with_the_run_policy(tmp_path, monkeypatch):
    rows = [
        {"step": 0, "cum_rollouts": 0, "cum_generated_tokens": 0, "eval_accuracy": 0.4},
        {"step": 1, "cum_rollouts": 32, "cum_generated_tokens": 90, "eval_accuracy": 0.5, "time_step_s": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = []
    monkeypatch.setattr(observability, "plot_accuracy", lambda curves, out, target=None: labels.extend(curves))
    for policy, label in (("pilot_commit", "Pilot-Commit"), ("dapo", "DAPO"), ("grpo", "GRPO")):
        cfg = load_config("tiny", ["steps=1", f"scheduler.policy={policy}"])
        summary = observability.summarize(cfg, tmp_path, wall_s=1.0)
        assert labels[-1] == label and summary["final_eval_accuracy"] == 0.5


def test_evaluation_samples_with_the_rollout_stop_tokens(cache_dir):
    """Stop tokens are part of how the policy is sampled: held-out accuracy must use them too
    (stopping at any digit cuts every multi-digit answer short)."""
    from omegaconf import OmegaConf

    from pc_megatron.data.task import prepare_task
    from pc_megatron.evaluate import evaluate
    from pc_megatron.model.tiny import load_tokenizer
    from pc_megatron.rewards import RewardConfig
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout import build_engine
    from pc_megatron.rollout.base import SamplingParams
    from pc_megatron.warmstart import initial_policy_dir

    cfg = load_config("tiny", ["eval.num_prompts=60", "eval.temperature=0"])
    policy = initial_policy_dir(cfg)
    tok = load_tokenizer(policy)
    rows = [r for r in prepare_task(cfg).eval if len(r.answer) > 1]
    engine = build_engine(OmegaConf.to_object(cfg.rollout), policy)
    digits = tuple(tok.convert_tokens_to_ids(list("0123456789")))
    with RewardPool(RewardConfig()) as rewards:
        plain = evaluate(engine, tok, rows, cfg.eval, rewards, SamplingParams(max_new_tokens=8), seed=0)
        stop = SamplingParams(max_new_tokens=8, stop_token_ids=digits)
        stopped = evaluate(engine, tok, rows, cfg.eval, rewards, stop, seed=0)
    assert plain["eval_accuracy"] > 0.2 and stopped["eval_accuracy"] == 0.0

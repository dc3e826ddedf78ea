"""What the tests share: the folders beside them, and a short run of the tiny recipe (a smaller
model and task, a short warm-start) with the metrics two such runs must agree on."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKERS = TESTS / "workers"  # subprocess entry points and the reward functions of tests/workers/
FIXTURES = TESTS / "fixtures"  # files a test reads as they are (tests/fixtures/)

SMALL = [
    "model.tiny.num_layers=2",
    "model.tiny.hidden_size=128",
    "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=256",
    "data.synthetic.num_train=200",
    "data.synthetic.num_eval=40",
    "data.synthetic.num_sft=400",
    "warmstart.steps=20",
    "algo.prompts_per_step=8",
    "algo.samples_per_prompt=4",
    "eval.every_steps=2",
    "progress=false",
]
TIME_KEYS = ("time_", "time/", "weight_sync_s", "weight_sync_gbps")  # wall-clock figures
RATE_SUFFIX = "_per_s"  # throughputs (learner/train_tokens_per_s): wall-clock figures too


def comparable(row: dict) -> dict:
    """A metrics row without its wall-clock figures: what a resumed or relaid run must reproduce."""
    return {k: v for k, v in row.items() if not k.startswith(TIME_KEYS) and not k.endswith(RATE_SUFFIX)}


def hang_generate_at(monkeypatch, call: int) -> None:
    """The hf engine's ``call``-th generate call (counting from 1) never returns (it sleeps 600 s): a hung
    engine, for the tests of the deadlines that must catch one."""
    import time

    from pc_megatron.rollout.hf_engine import HFEngine

    generate, calls = HFEngine.generate, {"n": 0}

    def hanging(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            time.sleep(600)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", hanging)

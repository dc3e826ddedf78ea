"""A math run as users bring it: verl-schema Parquet with chat messages, the tokenizer's chat
template and the recipe's instruction, prompts over the length limit left out and counted, the
math_verify reward with DAPO's overlong penalty, and two benchmarks evaluated side by side."""

from __future__ import annotations

import json
import string

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pc_megatron.cli import main
from pc_megatron.config import load_config
from pc_megatron.data.dataset import load_rows
from pc_megatron.errors import DataError

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTION = "Put the final answer in \\boxed{}."


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Qwen2 over printable ASCII, with a chat template, in HF format."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from pc_megatron.embedded.tiny_model import hf_config
    from pc_megatron.model.config import TinyModelConfig

    specials = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(string.printable) - set("\r\x0b\x0c")))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("<\\|im_(?:start|end)\\|>|."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE
    cfg = TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
    cfg.vocab_size, cfg.max_position_embeddings = 112, 256
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("chat") / "model"
    Qwen2ForCausalLM(hf_config(cfg, tokenizer)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _verl_rows(questions: list[tuple[str, str]], source: str, split: str) -> list[dict]:
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": q}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"index": i, "split": split},
        }
        for i, (q, a) in enumerate(questions)
    ]


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("math")
    train = [(f"What is {a} + {b}?", str(a + b)) for a in range(1, 4) for b in range(1, 4)]
    train.append(("Compute " + " + ".join(["1"] * 60) + ".", "60"))  # longer than max_prompt_tokens
    pq.write_table(pa.Table.from_pylist(_verl_rows(train, "fixture-math", "train")), d / "train.parquet")
    aime = [(f"Find x if x - {a} = {b}.", str(a + b)) for a, b in ((1, 2), (3, 4), (5, 6))]
    pq.write_table(pa.Table.from_pylist(_verl_rows(aime, "fixture-aime", "test")), d / "aime.parquet")
    flat = [{"id": f"m{i}", "prompt": f"What is {i} times 2?", "answer": f"\\frac{{{2 * i}}}{{1}}"} for i in range(4)]
    (d / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat))
    return d


def _overrides(chat_model, math_data, out_dir) -> list[str]:
    return [
        f"model.path={chat_model}",
        "warmstart.enabled=false",
        f"data.train_path={math_data / 'train.parquet'}",
        f"data.instruction='{INSTRUCTION}'",
        "data.max_prompt_tokens=100",
        f"eval.sets=[{{path: {math_data / 'aime.parquet'}, repeats: 2, temperature: 1.0, top_p: 0.7}},"
        f" {{path: {math_data / 'math500.jsonl'}}}]",
        "eval.every_steps=2",
        "reward.name=math_verify",
        "reward.overlong_buffer=4",
        "rollout.max_new_tokens=12",
        "algo.prompts_per_step=4",
        "algo.samples_per_prompt=4",
        "steps=2",
        "progress=false",
        f"out_dir={out_dir}",
        "name=math",
    ]


def test_verl_rows_load_with_their_messages_answer_and_index(math_data):
    rows = load_rows(math_data / "train.parquet")
    assert len(rows) == 10 and rows[0].id == "0" and rows[0].answer == "2"
    assert rows[0].prompt == "What is 1 + 1?" and rows[0].meta["messages"][0]["role"] == "user"
    assert rows[0].meta["data_source"] == "fixture-math" and "reward_model" not in rows[0].meta


def test_a_malformed_chat_row_names_file_row_and_reason(tmp_path):
    bad = _verl_rows([("What is 1 + 1?", "2"), ("What is 2 + 2?", "4")], "x", "train")
    bad[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet:row 2: a chat-format row needs reward_model.ground_truth"):
        load_rows(tmp_path / "bad.parquet")


def test_prompts_are_templated_instructed_and_length_limited(chat_model, math_data, tmp_path):
    from pc_megatron.data.task import prepare_prompts
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.prepare import load_task

    cfg = load_config("tiny", _overrides(chat_model, math_data, tmp_path))
    task = prepare_prompts(cfg.data, cfg.eval.sets, load_task(cfg), load_tokenizer(chat_model))
    first = task.train[0].prompt
    assert first == f"<|im_start|>user\nWhat is 1 + 1? {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert len(task.train) == 9 and task.dropped["data/dropped_long_prompts"] == 1
    assert [name for name, _, _ in task.sets] == ["aime", "math500"]
    assert task.sets[1][1][0].prompt.startswith("What is 0 times 2?")  # flat rows: no template under auto


def test_two_steps_of_a_math_run_with_two_benchmarks(chat_model, math_data, tmp_path, capsys):
    assert main(["train", "tiny", *_overrides(chat_model, math_data, tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "math" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in (rows[0], rows[2]):  # evaluated at the start and at step 2
        assert {"eval/aime", "eval/math500", "eval/mean"} <= set(r)
        assert r["eval/mean"] == pytest.approx((r["eval/aime"] + r["eval/math500"]) / 2)
        assert r["eval_accuracy"] == r["eval/mean"]  # no data.eval_path: the benchmarks' mean
    assert rows[0]["data/dropped_long_prompts"] == 1
    for r in rows[1:]:
        assert r["reward/timeouts"] == 0 and r["reward/errors"] == 0
        # an untrained policy rarely stops: cut at 12 tokens it scores -1 and the full overlong penalty
        assert r["reward/overlong"] > 0 and -2.0 <= r["reward_mean"] < -1.0
    assert "left out" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "math"), "--out", str(tmp_path / "report")]) == 0  # benchmarks plotted
    assert (tmp_path / "report" / "accuracy.png").stat().st_size > 10_000

"""A math run as users bring it: verl-schema Parquet with chat messages, a tokenizer with a chat template
and the recipe's instruction, two benchmarks (the fixtures ``chat_model`` and ``math_data`` of
tests/conftest.py are built here)."""

from __future__ import annotations

import json
import string
from pathlib import Path

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTION = "Put the final answer in \\boxed{}."


def make_chat_model(out: Path) -> Path:
    """A tiny Qwen2 over printable ASCII, with a chat template, in HF format at ``out``."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import hf_config

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
    Qwen2ForCausalLM(hf_config(cfg, tokenizer)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def verl_rows(questions: list[tuple[str, str]], source: str, split: str) -> list[dict]:
    """Rows in verl's schema: the question as chat messages, the answer as the reward model's ground truth."""
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


def write_math_data(d: Path) -> Path:
    """A verl-schema train split (one prompt over the recipe's length limit) and two benchmarks, one in
    verl's Parquet and one in flat JSONL, in ``d``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = [(f"What is {a} + {b}?", str(a + b)) for a in range(1, 4) for b in range(1, 4)]
    train.append(("Compute " + " + ".join(["1"] * 60) + ".", "60"))  # longer than max_prompt_tokens
    pq.write_table(pa.Table.from_pylist(verl_rows(train, "fixture-math", "train")), d / "train.parquet")
    aime = [(f"Find x if x - {a} = {b}.", str(a + b)) for a, b in ((1, 2), (3, 4), (5, 6))]
    pq.write_table(pa.Table.from_pylist(verl_rows(aime, "fixture-aime", "test")), d / "aime.parquet")
    flat = [{"id": f"m{i}", "prompt": f"What is {i} times 2?", "answer": f"\\frac{{{2 * i}}}{{1}}"} for i in range(4)]
    (d / "math500.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat))
    return d


def math_run_overrides(chat_model, math_data, out_dir) -> list[str]:
    """A two-step math run on ``chat_model`` and ``math_data``: math_verify with DAPO's overlong penalty,
    both benchmarks evaluated."""
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

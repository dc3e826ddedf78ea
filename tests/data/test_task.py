"""The prompts a run trains and evaluates on (``pc_megatron/data/task.py``): chat template, the recipe's
instruction, prompts over the length limit left out and counted, benchmarks."""

from __future__ import annotations

from pc_megatron.config import load_config
from tests.math_data import INSTRUCTION, math_run_overrides


def test_prompts_are_templated_instructed_and_length_limited(chat_model, math_data, tmp_path):
    from pc_megatron.data.task import prepare_prompts
    from pc_megatron.model.tokenizer import load_tokenizer
    from pc_megatron.run.prepare import load_task

    cfg = load_config("tiny", math_run_overrides(chat_model, math_data, tmp_path))
    task = prepare_prompts(cfg.data, cfg.eval.sets, load_task(cfg), load_tokenizer(chat_model))
    first = task.train[0].prompt
    assert first == f"<|im_start|>user\nWhat is 1 + 1? {INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert len(task.train) == 9 and task.dropped["data/dropped_long_prompts"] == 1
    assert [name for name, _, _ in task.sets] == ["aime", "math500"]
    assert task.sets[1][1][0].prompt.startswith("What is 0 times 2?")  # flat rows: no template under auto

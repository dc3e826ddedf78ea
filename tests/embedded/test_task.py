"""The embedded arithmetic task (``pc_megatron/embedded/task.py``)."""

from pc_megatron.embedded.config import SyntheticTaskConfig
from pc_megatron.embedded.task import FAMILIES, generate_splits


def test_synthetic_task_is_deterministic_disjoint_and_correct():
    cfg = SyntheticTaskConfig(num_train=300, num_eval=100, num_sft=300)
    a, b = generate_splits(cfg), generate_splits(cfg)
    assert [r.prompt for r in a["train"]] == [r.prompt for r in b["train"]]
    held_out = {r.prompt for r in a["eval"]}
    assert not held_out & {r.prompt for r in a["train"]} and not held_out & {r.prompt for r in a["sft"]}
    for row in a["train"][:50]:
        assert eval(row.prompt[:-1]) == int(row.answer)  # the prompts are Python arithmetic
    assert {r.meta["family"] for r in a["train"]} <= set(FAMILIES)
    assert len({r.meta["family"] for r in a["train"]}) >= 6  # a spread of difficulty

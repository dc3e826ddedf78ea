"""Dataset loading/validation, the synthetic task, the sampler and the reward."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pc_megatron.data import PromptSampler, load_rows
from pc_megatron.data.synthetic import FAMILIES, SyntheticTaskConfig, generate_splits
from pc_megatron.errors import DataError
from pc_megatron.rewards import IntegerMatchReward


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_rows_load_with_extra_fields_kept(tmp_path):
    f = write(tmp_path / "d.jsonl", [json.dumps({"id": 1, "prompt": "1+1=", "answer": 2, "level": "easy"})])
    (row,) = load_rows(f)
    assert (row.id, row.prompt, row.answer, row.meta) == ("1", "1+1=", "2", {"level": "easy"})


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"id": 1, "prompt": "x"}', "missing field(s) ['answer']"),
        ('{"id": 1, "prompt": "", "answer": "3"}', "'prompt' must be a non-empty string"),
        ('{"id": 1, "prompt": "x", "answer": [3]}', "'answer' must be a string or an integer"),
        ('{"id": 1, "prompt": "x", "answer": "3"', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_jsonl_row_names_file_line_and_reason(tmp_path, line, reason):
    good = json.dumps({"id": 0, "prompt": "p", "answer": "1"})
    f = write(tmp_path / "bad.jsonl", [good, line])
    with pytest.raises(DataError) as e:
        load_rows(f)
    assert f"{f}:2" in str(e.value) and reason in str(e.value)


def test_duplicate_ids_and_missing_file_and_extension(tmp_path):
    row = json.dumps({"id": "a", "prompt": "p", "answer": "1"})
    with pytest.raises(DataError, match="repeats id 'a'"):
        load_rows(write(tmp_path / "dup.jsonl", [row, row]))
    with pytest.raises(DataError, match="not found"):
        load_rows(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="unsupported extension"):
        load_rows(write(tmp_path / "d.csv", ["id,prompt,answer"]))


def test_parquet_rows_and_missing_column(tmp_path):
    pq.write_table(
        pa.table({"id": ["a", "b"], "prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), tmp_path / "ok.parquet"
    )
    assert [r.answer for r in load_rows(tmp_path / "ok.parquet")] == ["2", "4"]
    pq.write_table(pa.table({"id": ["a"], "prompt": ["1+1="]}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="missing column"):
        load_rows(tmp_path / "bad.parquet")


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


def test_sampler_resumes_exactly_across_epochs():
    s = PromptSampler(10, seed=3)
    first = s.next_batch(7)
    state = s.state_dict()
    rest = s.next_batch(12)
    t = PromptSampler(10, seed=3)
    t.load_state_dict(state)
    assert t.next_batch(12) == rest
    assert sorted(first + rest[:3]) == list(range(10))  # each epoch is a permutation


def test_integer_reward():
    r = IntegerMatchReward()
    assert r("42", "42").correct and r(" 42 ", "42").score == 1.0
    assert not r("42x", "42").correct and not r("", "42").correct and not r("41", "42").correct
    assert r("-7", "-7").correct

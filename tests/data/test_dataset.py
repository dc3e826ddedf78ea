"""Prompt datasets (``pc_megatron/data/dataset.py``): JSONL and Parquet rows, verl-schema chat rows, and
one clear error per bad row or file."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pc_megatron.data.dataset import load_rows
from pc_megatron.errors import DataError
from tests.math_data import verl_rows


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


def test_verl_rows_load_with_their_messages_answer_and_index(math_data):
    rows = load_rows(math_data / "train.parquet")
    assert len(rows) == 10 and rows[0].id == "0" and rows[0].answer == "2"
    assert rows[0].prompt == "What is 1 + 1?" and rows[0].meta["messages"][0]["role"] == "user"
    assert rows[0].meta["data_source"] == "fixture-math" and "reward_model" not in rows[0].meta


def test_a_malformed_chat_row_names_file_row_and_reason(tmp_path):
    bad = verl_rows([("What is 1 + 1?", "2"), ("What is 2 + 2?", "4")], "x", "train")
    bad[1]["reward_model"] = {"style": "rule", "ground_truth": None}
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad.parquet:row 2: a chat-format row needs reward_model.ground_truth"):
        load_rows(tmp_path / "bad.parquet")


def test_a_save_to_disk_folder_reads_like_the_file_it_came_from(tmp_path):
    """What ``datasets``' ``save_to_disk`` writes (Arrow IPC stream files listed in state.json, beside
    dataset_info.json), read with pyarrow alone; a damaged one is one error naming the folder."""
    import json

    import pyarrow as pa

    from pc_megatron.data.dataset import load_rows
    from pc_megatron.errors import DataError

    rows = [{"id": str(i), "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(7)]
    folder = tmp_path / "saved"
    folder.mkdir()
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for name, part in zip(names, (rows[:4], rows[4:]), strict=True):
        table = pa.Table.from_pylist(part)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names], "_split": None}))
    (folder / "dataset_info.json").write_text("{}")
    got = [(r.id, r.prompt, r.answer) for r in load_rows(folder)]
    assert got == [(r["id"], r["prompt"], r["answer"]) for r in rows]
    (folder / names[1]).write_bytes(b"not arrow")
    with pytest.raises(DataError, match=r"saved: not a readable save_to_disk folder"):
        load_rows(folder)

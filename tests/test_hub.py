"""``model.path`` as a Hugging Face Hub id (``pc_megatron/hub.py``), resolved by huggingface_hub from
a cache laid out as the Hub's client lays it out; offline, a model that is not cached is one clear line."""

from __future__ import annotations

import shutil

import pytest

from pc_megatron.errors import ModelFileError
from pc_megatron.hub import resolve_model_path


def _cache_with(model_dir, cache, repo="acme/tiny-policy", commit="0123456789abcdef0123456789abcdef01234567"):
    """What `hf download acme/tiny-policy` leaves in HF_HUB_CACHE (blobs linked from a snapshot aside)."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, entry / "snapshots" / commit)
    return entry / "snapshots" / commit


def test_a_hub_id_resolves_to_its_cached_snapshot_offline_and_a_folder_stays_a_folder(tiny_model_dir, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    snapshot = _cache_with(tiny_model_dir, tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path("acme/tiny-policy") == snapshot
    assert resolve_model_path(str(tiny_model_dir)) == tiny_model_dir  # a folder is never looked up
    with pytest.raises(ModelFileError, match=r"model.path=acme/other: .*HF_HUB_OFFLINE is set and it is not cached.*"
                                             r"hf download acme/other"):  # fmt: skip
        resolve_model_path("acme/other")


def test_a_run_starts_from_a_hub_id(tiny_model_dir, tmp_path, monkeypatch, cache_dir):
    from pc_megatron.config import load_config
    from pc_megatron.run.prepare import base_model_dir

    snapshot = _cache_with(tiny_model_dir, tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config("tiny", ["model.path=acme/tiny-policy", "warmstart.enabled=false"])
    assert base_model_dir(cfg.model, cache_dir, progress=False) == snapshot


def test_a_dataset_file_named_by_an_hf_url_is_read_from_the_cache_offline(tmp_path, monkeypatch):
    from pc_megatron.data.dataset import load_rows
    from pc_megatron.errors import DataError

    commit = "89abcdef0123456789abcdef0123456789abcdef"
    entry = tmp_path / "hub" / "datasets--acme--arith"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    (entry / "snapshots" / commit / "data").mkdir(parents=True)
    lines = [f'{{"id": "{i}", "prompt": "{i}+1=", "answer": "{i + 1}"}}' for i in range(3)]
    (entry / "snapshots" / commit / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert [r.answer for r in load_rows("hf://datasets/acme/arith/data/train.jsonl")] == ["1", "2", "3"]
    with pytest.raises(DataError, match=r"hf://datasets/acme/arith/data/test.jsonl: could not be resolved \(HF_HUB"):
        load_rows("hf://datasets/acme/arith/data/test.jsonl")

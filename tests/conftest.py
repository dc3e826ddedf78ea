"""Shared fixtures. Every test here runs on CPU; GPU tests carry the ``gpu`` marker and skip.

Fixtures used by tests in more than one folder live here; the models and data they build, in the
helper modules beside this file (``hf_models.py``, ``math_data.py``)."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch

from tests.hf_models import CONFIGS

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on CPU tensors in the interpreter
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One cache for the session, so the tiny model and task are built once."""
    path = tmp_path_factory.mktemp("pcm-cache")
    os.environ["PC_MEGATRON_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from pc_megatron.embedded.config import TinyModelConfig
    from pc_megatron.embedded.tiny_model import create_tiny_model

    cfg = TinyModelConfig(num_layers=2, hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256)
    return create_tiny_model(cfg, tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    """A learner of the tiny model, shared by the tests of a module that only read it."""
    from pc_megatron.learner.config import LearnerConfig
    from pc_megatron.learner.learner import Learner

    return Learner(tiny_model_dir, LearnerConfig(micro_batch_size=3), seed=0)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def hf_model(request, tmp_path_factory, tiny_model_dir):
    """A random model of each family (``hf_models.py``), with the tiny model's tokenizer files."""
    from tests.hf_models import make_hf_model

    folder = tmp_path_factory.mktemp(request.param) / "hf"
    make_hf_model(request.param, folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tiny_model_dir / f, folder / f)
    return folder


@pytest.fixture(scope="module")
def ragged_model(tmp_path_factory):
    """The model of the one-process ragged-batch tests: Qwen2 with tied embeddings (``hf_models.py``)."""
    from tests.hf_models import make_hf_model

    folder = tmp_path_factory.mktemp("ragged") / "qwen2-tied"
    make_hf_model("qwen2-tied", folder)
    return folder


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Qwen2 over printable ASCII, with a chat template, in HF format (``math_data.py``)."""
    from tests.math_data import make_chat_model

    return make_chat_model(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def math_data(tmp_path_factory):
    """A verl-schema math train split and two benchmarks (``math_data.py``)."""
    from tests.math_data import write_math_data

    return write_math_data(tmp_path_factory.mktemp("math"))


@pytest.fixture(scope="session")
def mlflow_tracking(tmp_path_factory):
    """A real MLflow tracking server (SQLite store) for the session: ``.uri``, and ``.proc`` (its own session)."""
    pytest.importorskip("mlflow", reason="the trackers extra: pip install -e '.[trackers]'")
    from types import SimpleNamespace

    from tests.trackers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as (uri, proc):
        yield SimpleNamespace(uri=uri, proc=proc)

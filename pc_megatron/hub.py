"""Models and data named as users name them on the Hugging Face Hub: ``model.path`` as ``org/name``
(optionally ``@revision``), a dataset file as ``hf://datasets/org/name/file``, resolved through the
Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``), from the cache alone when ``HF_HUB_OFFLINE`` is
set. On a cluster the cache must be on the shared file system (every node reads what an id resolves to)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pc_megatron.errors import ModelFileError

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_TRUE = ("1", "true", "yes", "on")


def hub_settings() -> tuple[bool, str]:
    """(offline, cache folder) as the environment says now (huggingface_hub reads them once, at import)."""
    from huggingface_hub import constants

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE or constants.HF_HUB_OFFLINE
    cache = os.environ.get("HF_HUB_CACHE") or (
        str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE
    )
    return offline, cache


def resolve_hf_file(url: str) -> Path:
    """A dataset file named ``hf://datasets/org/name[@revision]/path/in/repo`` (huggingface_hub's own
    URL form), through the Hugging Face cache like a model id; one DataError when it cannot be had."""
    from huggingface_hub import hf_hub_download

    from pc_megatron.errors import DataError

    parts = url.removeprefix("hf://").split("/")
    if len(parts) < 4 or parts[0] != "datasets":
        raise DataError(f"{url}: expected hf://datasets/ORG/NAME/FILE (a file of a dataset repository)")
    repo, _, revision = f"{parts[1]}/{parts[2]}".partition("@")
    offline, cache = hub_settings()
    try:
        got = hf_hub_download(
            repo, "/".join(parts[3:]), repo_type="dataset", revision=revision or None, cache_dir=cache,
            local_files_only=offline,
        )  # fmt: skip
    except Exception as e:
        why = "HF_HUB_OFFLINE is set and it is not cached" if offline else type(e).__name__
        raise DataError(
            f"{url}: could not be resolved ({why}; cache {cache}): download it where the cache is "
            f"(`hf download {repo} --repo-type dataset`), or give a local file"
        ) from None
    return Path(got)


def resolve_model_path(path: str) -> Path:
    """The HF folder ``path`` names: itself when it exists (or does not look like a Hub id), else the
    snapshot of the Hub id in the Hugging Face cache, downloaded first unless offline. A model neither
    here nor in the cache is one ModelFileError naming the cache and the way to fill it."""
    folder = Path(path).expanduser()
    if folder.exists() or path.startswith((".", "/", "~")) or not HUB_ID.fullmatch(path):
        return folder
    from huggingface_hub import snapshot_download

    repo, _, revision = path.partition("@")
    offline, cache = hub_settings()
    try:
        got = snapshot_download(
            repo, revision=revision or None, cache_dir=cache, local_files_only=offline, allow_patterns=MODEL_FILES
        )
    except Exception as e:  # not cached offline, unknown repo, no network: one line either way
        why = "HF_HUB_OFFLINE is set and it is not cached" if offline else f"{type(e).__name__}"
        raise ModelFileError(
            f"model.path={path}: not a folder on this machine, and the Hugging Face Hub id could not be resolved "
            f"({why}; cache {cache}): download it where the cache is (`hf download {repo}`), or give its folder"
        ) from None
    return Path(got)

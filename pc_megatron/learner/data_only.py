"""A learner checkpoint is read as data, all of it, before Megatron or torch's distributed checkpoint
reader opens it.

torch's DCP reads ``.metadata`` with a plain ``pickle.load`` and each byte item (``_extra_state``:
Transformer Engine's FP8 state, the local spec's empty state) with ``torch.load(weights_only=False)``:
a downloaded checkpoint could run code on ``--resume`` or ``convert --to hf``. So first:

- ``.metadata`` is unpickled here by an unpickler that builds only DCP's metadata classes and torch's
  plain pieces (``Size``, dtypes, layouts, memory formats);
- every byte item is read from its storage file and unpickled with torch's weights-only unpickler;
- ``common.pt`` (Megatron's common state: optimizer groups, lr schedule) likewise.

Anything else is one ``ModelFileError`` naming the file and what it would have built.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch

from pc_megatron.errors import ModelFileError

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "ChunkStorageMetadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.planner": {
        "SavePlan",
        "WriteItem",
        "WriteItemType",
        "TensorWriteData",
        "LoadPlan",
        "ReadItem",
        "LoadItemType",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
}


class _Refused(pickle.UnpicklingError):
    """A global the metadata may not name."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        plain = module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.layout | torch.memory_format
        )
        if plain or name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


def _refuse(path: Path, what: str) -> ModelFileError:
    return ModelFileError(
        f"{path}: holds Python objects that loading would run as code ({what[:120]}), and a checkpoint is read as "
        "data only; pc-megatron does not write such files: do not load it"
    )


def read_metadata(folder: Path):
    """The DCP ``Metadata`` of the learner checkpoint ``folder``, built from data only."""
    path = Path(folder) / ".metadata"
    try:
        with open(path, "rb") as f:
            return _MetadataUnpickler(f).load()
    except _Refused as e:
        raise _refuse(path, str(e)) from None
    except (OSError, EOFError, AttributeError, ValueError, pickle.UnpicklingError) as e:  # damaged, not hostile
        raise ModelFileError(f"{path}: unreadable distributed checkpoint metadata ({type(e).__name__}: {e})") from None


def _weights_only(path: Path, data: io.BytesIO | Path, what: str) -> None:
    try:
        torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = str(e).split("Unsupported global: ")[-1].split(" was not")[0].strip().splitlines()[0]
        raise _refuse(path, f"{what}: {found}") from None
    except Exception as e:  # cut short or overwritten: torch's reader names only itself
        detail = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ModelFileError(
            f"{path}: cannot read the learner checkpoint's {what} ({detail}); its files are damaged or incomplete: "
            "resume from an earlier checkpoint (write its folder name into checkpoints/latest)"
        ) from None


def check_data_only(folder: Path):
    """Refuse the learner checkpoint ``folder`` unless every pickle DCP and Megatron would load is data;
    its DCP ``Metadata`` (read as data) when it is."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    folder = Path(folder)
    meta = read_metadata(folder)
    for key, item in meta.state_dict_metadata.items():
        if not isinstance(item, BytesStorageMetadata):
            continue
        info = meta.storage_data[MetadataIndex(key)]
        if getattr(info, "transform_descriptors", None):  # compressed or encoded: not read as plain bytes here
            raise _refuse(folder / info.relative_path, f"byte item {key} stored through {info.transform_descriptors}")
        with open(folder / info.relative_path, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        _weights_only(folder / info.relative_path, io.BytesIO(blob), f"byte item {key}")
    if (folder / "common.pt").is_file():
        _weights_only(folder / "common.pt", folder / "common.pt", "common state")
    return meta

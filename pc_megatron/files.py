"""Writes that a full disk, a kill or a second writer cannot leave half-done: the text goes to a file
of this process's own beside the target, is flushed to disk, and replaces the target in one rename."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """``path`` holds ``text`` or what it held before, never a part of it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself on disk
    finally:
        os.close(fd)

"""Files a run owns: writes that a full disk, a kill or a second writer cannot leave half-done (the
text goes to a file of this process's own beside the target, is flushed to disk, and replaces the
target in one rename), and one process at a time on a shared result (``one_at_a_time``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
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


@contextlib.contextmanager
def one_at_a_time(lock_path: Path) -> Iterator[None]:
    """Only one process at a time inside (an exclusive lock on ``lock_path``, waited for): for work
    that two runs may start at once on one shared result, such as computing a cached warm-start. Check
    for the result again once inside: the process before may have made it."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

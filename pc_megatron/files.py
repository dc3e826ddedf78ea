"""Files a run owns: writes that a full disk, a kill or a second writer cannot leave half-done (the
text goes to a file of this process's own beside the target, is flushed to disk, and replaces the
target in one rename), and one process at a time on a shared result (``one_at_a_time``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pc_megatron.errors import ConfigError


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


def try_lock(f: IO) -> str | None:
    """An exclusive lock on the open file ``f`` without waiting: None once it is this process's (its pid
    written into the file), else what the holder wrote there. Other ``OSError`` (a file system without
    locks) goes to the caller."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        f.seek(0)
        return f.read().strip() or "another process"
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return None


WAIT_FOR_OTHERS_S = 6 * 3600.0
"""How long ``one_at_a_time`` waits for another process's work (a warm-start of a large model takes hours)."""


@contextlib.contextmanager
def one_at_a_time(lock_path: Path, what: str = "shared work", deadline_s: float | None = None) -> Iterator[None]:
    """Only one process at a time inside (an exclusive lock on ``lock_path``): for work that two runs may
    start at once on one shared result, such as computing a cached warm-start. Check for the result again
    once inside: the process before may have made it. A wait says once who holds the lock (the pid it
    wrote), and gives up after ``deadline_s`` (default ``WAIT_FOR_OTHERS_S``) naming it: a hung or
    stopped holder does not hold this run forever."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (WAIT_FOR_OTHERS_S if deadline_s is None else deadline_s)
    with open(lock_path, "a+") as f:
        said = False
        while (holder := try_lock(f)) is not None:
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"{what}: waited for {holder} (it holds {lock_path}) longer than the deadline; if it is "
                    "stuck, stop it, or remove the lock file once no process uses it"
                )
            if not said:
                print(f"waiting for {holder}, which is computing {what} ({lock_path})", flush=True)
                said = True
            time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)

"""Files a run owns (``pc_megatron/files.py``): writes that are whole or not at all, one run per folder."""

from __future__ import annotations

import pytest

from pc_megatron.errors import ConfigError
from pc_megatron.files import atomic_write_text
from pc_megatron.run.folder import claim_run_dir


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    atomic_write_text(path, "seed: 1\n")
    atomic_write_text(path, "seed: 2\n")
    assert path.read_text() == "seed: 2\n" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_run_folder_is_claimed_by_one_run_at_a_time(tmp_path):
    first = claim_run_dir(tmp_path)
    with pytest.raises(ConfigError, match=r"in use by pid \d+ .* another name="):
        claim_run_dir(tmp_path)
    first.close()  # the process that held it ended
    claim_run_dir(tmp_path).close()


def test_a_second_run_started_in_a_busy_folder_stops_before_touching_it(tmp_path, cache_dir):
    from pc_megatron.config import load_config
    from pc_megatron.train import train
    from tests.settings import SMALL

    held = claim_run_dir(tmp_path)
    try:
        with pytest.raises(ConfigError, match="in use by"):
            train(load_config("tiny", [*SMALL, "steps=1"]), tmp_path)
        assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "metrics.jsonl").exists()
    finally:
        held.close()


def test_latest_naming_anything_but_a_checkpoint_is_refused(tmp_path):
    from pc_megatron.checkpoint.store import latest_checkpoint
    from pc_megatron.errors import ModelFileError

    (tmp_path / "step_000004").mkdir()
    (tmp_path / "latest").write_text("../../etc")
    with pytest.raises(ModelFileError, match=r"names '../../etc', not a checkpoint .*step_000004"):
        latest_checkpoint(tmp_path)
    (tmp_path / "latest").write_text("step_000004\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000004"


def test_shared_work_is_done_by_one_process_and_the_second_finds_it(tmp_path):
    """Two runs computing one cached warm-start: the second waits for the first, then finds the
    result instead of replacing the folder the first is about to read."""
    import subprocess
    import sys
    import time

    from pc_megatron.files import one_at_a_time

    lock, result = tmp_path / "ws.lock", tmp_path / "ws"
    code = (
        "import sys, time; from pathlib import Path; from pc_megatron.files import one_at_a_time\n"
        "with one_at_a_time(Path(sys.argv[1])):\n"
        "    print('in', flush=True); time.sleep(2); Path(sys.argv[2]).mkdir()\n"
    )
    first = subprocess.Popen([sys.executable, "-c", code, str(lock), str(result)], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "in"
    t0 = time.monotonic()
    with one_at_a_time(lock):
        waited = time.monotonic() - t0
        assert result.is_dir()  # made by the first, which held the lock until it was done
    assert waited > 1.0 and first.wait() == 0


def test_a_file_system_without_locks_is_one_line(tmp_path, monkeypatch):
    """Some NFS and FUSE mounts answer flock with ENOLCK or EOPNOTSUPP: said in one line naming the fix."""
    import errno
    import fcntl

    def no_locks(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ConfigError, match="its file system cannot lock files.*No locks available.*flock"):
        claim_run_dir(tmp_path)


def test_a_wait_for_shared_work_names_the_holder_and_gives_up_after_its_deadline(tmp_path, capsys):
    """A run that waits for a warm-start another run computes says who computes it, and a hung holder
    does not hold it forever (it waited without end, silently)."""
    import subprocess
    import sys

    from pc_megatron.files import one_at_a_time

    lock = tmp_path / "ws.lock"
    code = (
        "import sys, time; from pathlib import Path; from pc_megatron.files import one_at_a_time\n"
        "with one_at_a_time(Path(sys.argv[1])):\n"
        "    print('in', flush=True); time.sleep(30)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "in"
        with pytest.raises(ConfigError, match=rf"the warm-start ab12: waited for pid {holder.pid} .*longer than"):
            with one_at_a_time(lock, "the warm-start ab12", deadline_s=1.5):
                pass
        assert f"waiting for pid {holder.pid}, which is computing the warm-start ab12" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()

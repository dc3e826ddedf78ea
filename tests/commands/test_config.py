"""`pc-megatron config show` (``pc_megatron/commands/config.py``)."""

import subprocess
import sys


def test_config_show_prints_resolved_yaml():
    out = subprocess.run(
        [sys.executable, "-m", "pc_megatron.cli", "config", "show", "tiny", "seed=7"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "seed: 7" in out.stdout and "prompts_per_step: 64" in out.stdout

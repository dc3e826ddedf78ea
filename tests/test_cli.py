"""``pc-megatron`` itself (``pc_megatron/cli.py``): a bad command line is one error line, without a traceback."""

import subprocess
import sys


def test_cli_prints_one_error_line_without_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "pc_megatron.cli", "train", "learner.lrr=1"], capture_output=True, text=True
    )
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert lines == [
        "error: override 'learner.lrr=1': unknown config key 'learner.lrr'; did you mean "
        "learner.lr, learner.min_lr, learner.fp8?"
    ]

"""`pc-megatron train --resume` (``pc_megatron/commands/train.py``): what it refuses before anything starts."""

from __future__ import annotations

from pc_megatron.cli import main


def test_a_run_whose_config_was_cut_short_is_refused_not_resumed_on_the_defaults(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("")  # a write a full disk or a kill cut short
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml is empty" in err and "default config" in err

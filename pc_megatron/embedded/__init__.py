"""The embedded task, in one home: what lets the whole stack run end to end on a CPU with nothing
downloaded.

- ``config.py``: its sections, ``data.synthetic.*`` and ``model.tiny.*``;
- ``task.py``: the synthetic arithmetic rows (families, splits, pool candidates);
- ``tiny_model.py``: a character-level tokenizer and a tiny Qwen2 policy, built in-process and saved
  as an HF folder;
- ``warmstart/``: its SFT warm-start for the default recipe, shipped (other settings compute one once
  into the cache: ``pc_megatron/warmstart.py``);
- ``pools.py``: the RL pool chosen under that warm-start by exact pass rate (hard, easy, graded).

``pc_megatron/run/prepare.py`` takes this path when the config names no data files and no generator.
No module imports are made here: the config reads the sections without the rest.
"""

"""The embedded task: what lets the whole stack run end to end on a CPU with nothing downloaded.

- ``tiny_model.py``: a character-level tokenizer and a tiny Qwen2 policy (``model.tiny``), built
  in-process and saved as an HF folder;
- the synthetic arithmetic rows themselves: ``pc_megatron/data/synthetic.py`` (``data.synthetic``);
- its SFT warm-start: shipped in ``pc_megatron/assets/warmstart`` for the default recipe, else
  computed once into the cache (``pc_megatron/warmstart.py``);
- ``pools.py``: the RL pool chosen under that warm-start by exact pass rate (hard, easy, graded).

``pc_megatron/run/prepare.py`` takes this path when the config names no data files and no generator.
No module imports are made here: ``model.config`` reads the tiny model's config without the rest.
"""

"""Prompt datasets (JSONL/Parquet rows with id, prompt, answer: ``dataset.py``), the generated tasks
(``synthetic.py``, ``word_problems.py``), the sampler and the ``data.*`` section (``config.py``)."""

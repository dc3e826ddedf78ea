"""Training-state checkpoints (``store.py``; the layout of a run's ``checkpoints/`` is described there),
their plain-data state file (``plain.py``), and conversion to and from Hugging Face folders
(``convert.py``); the ``checkpoint.*`` section in ``config.py``."""

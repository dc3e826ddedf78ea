"""The Megatron-Core learner: model build (``model.py``), parallel state (``parallel.py``), SFT and RL
updates (``learner.py``); the ``learner.*`` section in ``config.py``."""

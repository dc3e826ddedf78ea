"""Pure functions of the RL math: group advantages (``advantages.py``), the RL objective
(``objective.py``), the update (``update.py``); the ``algo.*`` section in ``config.py``."""

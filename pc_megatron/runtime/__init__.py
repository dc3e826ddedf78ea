"""Roles and the runtimes that place them (``roles.py``): this process (``local.py``) or Ray actors
(``ray_runtime.py``, the cluster and placement in ``ray_cluster.py``); threads and cores
(``resources.py``); the ``ray.*`` section in ``config.py``."""

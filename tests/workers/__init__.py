"""Subprocess entry points: scripts run by torchrun or killed by a test, and the reward functions a
reward pool's worker processes import by name (with this folder on ``sys.path``). The tests import
their helpers from here too (``tests.workers.parallel_worker.ragged_batch``)."""

"""Learner -> engine weight transfer: the Megatron <-> Hugging Face name mapping (``mapping.py``, shared
with checkpoint export), tensor-parallel sharding (``sharding.py``), the bucketed transports
(``transport.py``), per-GPU routes (``routes.py``, ``routed.py``) and the broadcast group."""

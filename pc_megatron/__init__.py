"""pc-megatron: RL post-training for LLMs with Pilot-Commit rollout allocation."""

__version__ = "0.1.0"

"""Version-checked shims that let Megatron-Core run on CPU over gloo (see ``megatron_cpu``)."""

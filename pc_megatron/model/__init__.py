"""Model description (HF config → architecture spec), the in-process tokenizer and tiny policy."""

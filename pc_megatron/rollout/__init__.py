"""Rollout engines: generate completions, receive HF-named weights from the learner (the protocol:
``base.py``; the factory: ``engines.build_engine``; the loop's producer of batches: ``producer.py``; the
``rollout.*`` section: ``config.py``)."""

"""The run's owner: its folder (claim, ``config.yaml``, ``resumes.jsonl``, the resume rules and the input
fingerprint: ``folder.py``), its state across a checkpoint (``state.py``), the row stream and its sinks
(``logs.py``, ``trackers.py``), signals (``preemption.py``) and the setup that opens a run
(``prepare.py``, ``setup.py``). ``train.py`` keeps the verbs."""

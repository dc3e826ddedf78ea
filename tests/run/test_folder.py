"""What a run trains on, checked on resume (``pc_megatron/run/folder.py``): data files changed on disk
under the same names and a changed tokenizer are named; a key a later version adds is no difference.
(A config.yaml edited by hand, end to end: tests/test_faults.py.)"""

import dataclasses

import pytest

from pc_megatron.config import load_config
from pc_megatron.data.dataset import PromptRow
from pc_megatron.data.task import Task
from pc_megatron.errors import ConfigError
from pc_megatron.run.folder import check_resume, run_fingerprint


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _task(answers):
    rows = [PromptRow(str(i), f"{i}+1=", a) for i, a in enumerate(answers)]
    return Task(train=rows, eval=rows[:2], sft=[])


def test_a_dataset_of_the_same_length_with_other_rows_is_named(tokenizer):
    cfg = load_config("tiny")
    saved = run_fingerprint(cfg, _task(["1", "2", "3"]), tokenizer)
    check_resume(saved, run_fingerprint(cfg, _task(["1", "2", "3"]), tokenizer), "ckpt")  # the same inputs
    with pytest.raises(ConfigError, match=r"ckpt: .* the training prompts and answers \(3 rows, \w+ at the checkpoint"):
        check_resume(saved, run_fingerprint(cfg, _task(["1", "2", "4"]), tokenizer), "ckpt")
    with pytest.raises(ConfigError, match=r"the held-out prompts and answers") as e:
        check_resume(saved, run_fingerprint(cfg, _task(["1", "9", "3"]), tokenizer), "ckpt")
    assert "training prompts" in str(e.value)  # both named in one message


def test_a_changed_tokenizer_is_named(tokenizer):
    import copy

    cfg = load_config("tiny")
    saved = run_fingerprint(cfg, _task(["1"]), tokenizer)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<extra>"])
    with pytest.raises(ConfigError, match=r"the tokenizer \(vocabulary, special tokens, chat template\)"):
        check_resume(saved, run_fingerprint(cfg, _task(["1"]), other), "ckpt")


def test_config_keys_are_compared_as_values_and_a_key_a_later_version_adds_is_no_difference(tokenizer):
    cfg = load_config("tiny")
    saved = run_fingerprint(cfg, _task(["1"]), tokenizer)
    del saved["config"]["algo.loss.correction"]  # a checkpoint from before the key existed
    check_resume(saved, run_fingerprint(cfg, _task(["1"]), tokenizer), "ckpt")
    changed = dataclasses.replace(cfg, seed=7)
    with pytest.raises(ConfigError, match=r"the config's keys a resume may not change \(seed: 0 -> 7\)"):
        check_resume(saved, run_fingerprint(changed, _task(["1"]), tokenizer), "ckpt")
    check_resume(None, saved, "ckpt")  # a checkpoint written before fingerprints: nothing to compare


def test_a_resume_on_other_weights_another_split_or_another_reward_source_is_named(tokenizer, tiny_model_dir, tmp_path):
    """What config.yaml does not show: the starting weights replaced under the same folder, a tokenizer
    that splits text otherwise with the same vocabulary, a user's reward function edited in place."""
    import shutil
    import sys

    reward = tmp_path / "my_reward.py"
    reward.write_text("def score(completion, answer):\n    return completion.strip() == answer\n")
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = load_config("tiny", ["reward.function=my_reward:score"])
        policy = tmp_path / "policy"
        shutil.copytree(tiny_model_dir, policy)
        saved = run_fingerprint(cfg, _task(["1"]), tokenizer, policy)
        check_resume(saved, run_fingerprint(cfg, _task(["1"]), tokenizer, policy), "ckpt")  # the same inputs
        reward.write_text("def score(completion, answer):\n    return answer in completion\n")
        with pytest.raises(ConfigError, match="the reward function's source"):
            check_resume(saved, run_fingerprint(cfg, _task(["1"]), tokenizer, policy), "ckpt")
        reward.write_text("def score(completion, answer):\n    return completion.strip() == answer\n")
        from safetensors.torch import load_file, save_file

        weights = load_file(policy / "model.safetensors")
        weights["extra.bias"] = next(iter(weights.values())).new_zeros(3)
        save_file(weights, policy / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ConfigError, match="the starting .and reference. weights"):
            check_resume(saved, run_fingerprint(cfg, _task(["1"]), tokenizer, policy), "ckpt")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_reward", None)


def test_a_tokenizer_that_splits_otherwise_is_named(tokenizer):
    cfg = load_config("tiny")
    saved = run_fingerprint(cfg, _task(["1"]), tokenizer)

    class Splits:  # the same vocabulary, special tokens and template; other ids for the same text
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def encode(self, text, add_special_tokens=True):
            return list(reversed(self.inner.encode(text, add_special_tokens=add_special_tokens)))

    with pytest.raises(ConfigError, match="how the tokenizer splits text"):
        check_resume(saved, run_fingerprint(cfg, _task(["1"]), Splits(tokenizer)), "ckpt")

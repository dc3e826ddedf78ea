"""Run preparation (``pc_megatron/run/prepare.py``): a real-data run never enters the embedded task's pool
selection."""

from pathlib import Path


def test_a_real_data_run_never_enters_the_embedded_tasks_pool_selection(tmp_path):
    """prepare_run on a generated task with model.path: the embedded task's code (its pools, its tiny
    model) is never imported; its config sections are part of the config."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pc_megatron.config import load_config\n"
        "from pc_megatron.run.prepare import prepare_run\n"
        f"cfg = load_config('smollm2-arith', [\"model.fixture=''\", 'model.path={tmp_path / 'm'}', "
        "'warmstart.enabled=false', 'data.word_problems.num_train=20', 'data.word_problems.num_eval=5'])\n"
        "p = prepare_run(cfg, progress=False)\n"
        "assert len(p.task.train) == 20 and p.task.train[0].prompt.startswith('<|im_start|>'), p.task.train[0]\n"
        "code = ('pc_megatron.embedded.pools', 'pc_megatron.embedded.tiny_model')\n"
        "print(sorted(m for m in sys.modules if m in code))\n"
    )
    _smollm2_like_folder(tmp_path / "m")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _smollm2_like_folder(folder: Path) -> None:
    """A one-layer Llama whose tokenizer has a ChatML chat template, as SmolLM2's has."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from pc_megatron.embedded.tiny_model import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=64, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)

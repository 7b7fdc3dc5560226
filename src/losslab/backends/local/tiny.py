"""Tiny randomly initialised causal LMs for tests: built from a config, no download.

`make_tiny_model_dir(path, arch="llama"|"qwen3", seed=0)` writes a `save_pretrained` folder
(hidden 32, 2 layers, 4 heads / 2 KV heads, tied embeddings) plus an offline byte-level tokenizer
(one token per UTF-8 byte, built with the `tokenizers` library) wrapped as
`PreTrainedTokenizerFast`, with a ChatML chat template and eos/pad `<|im_end|>`. The folder is a
valid `base_model` for `LocalServiceClient`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import torch

from losslab.atomic import atomic_dir

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_tokenizer():
    """Byte-level tokenizer: 256 byte tokens + the 3 ChatML specials (vocab 259)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=512,
    )


def tiny_config(arch: Literal["llama", "qwen3"], vocab_size: int, eos_id: int):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        bos_token_id=None,
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(head_dim=8, **common)
    raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")


def make_tiny_model_dir(
    path: str | os.PathLike[str], arch: Literal["llama", "qwen3"] = "llama", seed: int = 0
) -> Path:
    """Write a tiny random model + tokenizer to `path` (created or replaced atomically) and return
    it. Same (arch, seed) gives bitwise-identical weights."""
    from transformers import AutoModelForCausalLM

    if arch not in ("llama", "qwen3"):
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    target = Path(path)
    tokenizer = make_tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = tiny_config(arch, vocab_size=len(tokenizer), eos_id=eos_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_dir(target) as tmp:  # an existing target is replaced whole
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return target

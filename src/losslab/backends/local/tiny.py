"""Tiny randomly initialised causal LMs for tests: built from a config, no download.

`make_tiny_model_dir(path, arch=..., seed=0)` writes a `save_pretrained` folder (hidden 32,
4 heads / 2 KV heads, tied embeddings; 2 layers, 4 for the hybrids so that 3 linear-attention
layers precede one full-attention layer as in Qwen3.5) plus an offline byte-level tokenizer
(one token per UTF-8 byte, built with the `tokenizers` library) wrapped as
`PreTrainedTokenizerFast`, with a ChatML chat template and eos/pad `<|im_end|>`. The folder is a
valid `base_model` for `LocalServiceClient`.

Families (`TINY_ARCHS`), one per cache kind transformers has:

| arch | transformers config | cache layers |
|---|---|---|
| `llama`, `qwen3` | `LlamaConfig`, `Qwen3Config` | KV (`DynamicLayer`) |
| `qwen3_5` | `Qwen3_5TextConfig` (dense Qwen3.5) | 3 x `LinearAttentionLayer` (Gated DeltaNet) + KV |
| `qwen3_5_moe` | `Qwen3_5MoeTextConfig` (4 experts, top-2 + shared expert) | as `qwen3_5` |
| `qwen3_next` | `Qwen3NextConfig` (hybrid MoE) | as `qwen3_5` |
| `gemma3` | `Gemma3TextConfig`, window 4, layers sliding + full | `DynamicSlidingWindowLayer` + KV |

`shrink_config(config)` makes any such config tiny while keeping its model type and its layer
pattern; the rehearsal (`losslab run --rehearse`) uses it on the plan's own architecture.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

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


TINY_ARCHS = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "gemma3")
"""The families `make_tiny_model_dir` builds (tested through every backend call)."""

TINY_WIDTHS: dict[str, int] = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    # Gated DeltaNet (linear attention) heads: Qwen3.5 and Qwen3-Next
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    # mixture of experts: Qwen3.5-MoE and Qwen3-Next
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=32,
)
"""The widths every tiny model shares; keys a config class lacks are left alone."""


def shrink_config(config, *, num_hidden_layers: int | None = None, vocab_size: int | None = None):
    """A copy of `config` (any transformers config) with the `TINY_WIDTHS` widths, a few layers
    and, when given, `vocab_size`, keeping its model type and its pattern of layer kinds: the
    first `num_hidden_layers` entries of `layer_types` (default: one period of the pattern, i.e.
    up to and including the first full-attention layer, at least 2 layers)."""
    cfg = copy.deepcopy(config)
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    if num_hidden_layers is None:
        full = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        num_hidden_layers = max(2, full[0] + 1) if full else 2
    for key, value in TINY_WIDTHS.items():
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    cfg.num_hidden_layers = num_hidden_layers
    if layer_types:
        if len(layer_types) < num_hidden_layers:  # repeat the pattern
            layer_types = (layer_types * num_hidden_layers)[:num_hidden_layers]
        cfg.layer_types = layer_types[:num_hidden_layers]
    for key in ("mlp_only_layers",):  # layer indices beyond the shrunk stack
        if getattr(cfg, key, None):
            setattr(cfg, key, [i for i in getattr(cfg, key) if i < num_hidden_layers])
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = min(cfg.max_window_layers, num_hidden_layers)
    if vocab_size is not None:
        cfg.vocab_size = vocab_size
    return cfg


def tiny_config(arch: str, vocab_size: int, eos_id: int):
    """The tiny config of family `arch` (one of `TINY_ARCHS`) for a `vocab_size` tokenizer."""
    import transformers

    special = dict(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None)
    common = dict(
        vocab_size=vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        **special,
    )
    if arch == "llama":
        base = transformers.LlamaConfig(**common)
        return shrink_config(base, num_hidden_layers=2)
    if arch == "qwen3":
        return shrink_config(transformers.Qwen3Config(**common), num_hidden_layers=2)
    if arch == "qwen3_5":
        return shrink_config(transformers.Qwen3_5TextConfig(**common), num_hidden_layers=4)
    if arch == "qwen3_5_moe":
        return shrink_config(transformers.Qwen3_5MoeTextConfig(**common), num_hidden_layers=4)
    if arch == "qwen3_next":
        return shrink_config(transformers.Qwen3NextConfig(**common), num_hidden_layers=4)
    if arch == "gemma3":
        # window 4 < the test prompts + completions, so the window really slides
        base = transformers.Gemma3TextConfig(
            sliding_window=4,
            num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        )
        return shrink_config(base, num_hidden_layers=2)
    raise ValueError(f"arch must be one of {list(TINY_ARCHS)}, got {arch!r}")


def make_tiny_model_dir(path: str | os.PathLike[str], arch: str = "llama", seed: int = 0) -> Path:
    """Write a tiny random model + tokenizer to `path` (created or replaced atomically) and return
    it. Same (arch, seed) gives bitwise-identical weights."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"arch must be one of {list(TINY_ARCHS)}, got {arch!r}")
    tokenizer = make_tiny_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = tiny_config(arch, vocab_size=len(tokenizer), eos_id=eos_id)
    return save_random_model(path, config, tokenizer, seed=seed)


def save_random_model(path: str | os.PathLike[str], config, tokenizer, seed: int = 0) -> Path:
    """Initialise a causal LM from `config` with `torch.manual_seed(seed)` and write it with
    `tokenizer` to `path` (replaced atomically); same (config, seed) gives the same weights."""
    from transformers import AutoModelForCausalLM

    target = Path(path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with atomic_dir(target) as tmp:  # an existing target is replaced whole
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    return target

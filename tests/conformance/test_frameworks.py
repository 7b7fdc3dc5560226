"""The reference registry and the extractor features the real frameworks need: star imports
(verl `AlgoConfig`), registering decorators (verl/SkyRL registries), heavy imports stubbed
(ray, loguru), config-class defaults read with ast. The repository is made by the test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from losslab.conformance.frameworks import (
    class_defaults,
    framework_for,
    registry,
    resolve_reference,
)
from losslab.conformance.pinned import GitFiles, PinnedSourceError, extract
from losslab.conformance.pinned_runner import _load
from losslab.plan import RevisionError, parse_revision

FILES = {
    "fw/__init__.py": "",
    "fw/config/__init__.py": "from .algo import *  # noqa\n",
    "fw/config/algo.py": "class AlgoConfig:\n    kind = 'algo'\n",
    "fw/registry.py": (
        "import ray\n\nREG = {}\n\n\ndef register(name):\n"
        "    def deco(fn):\n        REG[name] = ray.remote(fn)\n        return fn\n    return deco\n"
    ),
    "fw/core.py": (
        "import torch\nfrom loguru import logger\nfrom fw.config import AlgoConfig\n"
        "from fw.registry import register\n\n\n@register('tv')\n"
        "def loss(x, config):\n    assert not isinstance(config, AlgoConfig)\n"
        "    logger.info('computing')\n    return (x * 2).sum()\n"
    ),
    "fw/bad.py": "import notalib\n\n\ndef f(x):\n    return notalib.g(x)\n",
    "fw/cfg.py": (
        "from dataclasses import dataclass, field\nfrom pydantic import Field\n\n\n"
        "class Base:\n    clip_ratio_c: float = 3.0\n\n\n@dataclass\nclass Actor(Base):\n"
        "    clip_ratio: float = 0.2\n    low: float = field(default=0.25)\n"
        "    kl_tau: float = Field(1e-3, ge=0)\n    name: str = 'x'\n"
    ),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("fwrepo")
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = [
        "git",
        "-C",
        str(root),
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@e",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fw"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    return root, head.strip()


def test_registry_has_the_registered_frameworks() -> None:
    assert set(registry()) == {
        "openrlhf",
        "stable_rl",
        "verl",
        "verl_registry",
        "skyrl",
        "skyrl_registry",
        "prime_rl",
        "spindle",
        "tinker",
        "trl",
        "slime",
        "areal",
    }
    assert framework_for("huggingface/trl", "GRPOTrainer._compute_loss").name == "trl"
    assert framework_for("THUDM/slime", "icepop_function").name == "slime"
    assert framework_for("inclusionAI/AReaL", "ppo_actor_loss_fn").name == "areal"
    assert framework_for("NovaSky-AI/SkyRL", "dppo_policy_loss").name == "skyrl"
    assert framework_for("NovaSky-AI/SkyRL", "gspo_policy_loss").name == "skyrl_registry"
    assert framework_for("verl-project/verl", "compute_policy_loss_gspo").name == "verl_registry"
    assert framework_for("verl-project/verl", "compute_policy_loss_dppo_kl").name == "verl"
    with pytest.raises(
        RevisionError,
        match="no known reference for a/b::f; losslab knows .*"
        "verl-project/verl::compute_policy_loss_dppo_tv",
    ):
        framework_for("a/b", "f")


def test_star_import_decorator_and_heavy_imports(repo: tuple[Path, str]) -> None:
    root, head = repo
    files = GitFiles(root, parse_revision(f"x/fw@{head}:fw/core.py::loss()"))
    modules = extract(files, "loss")
    by_path = {m.path: m for m in modules}
    core = by_path["fw/core.py"]
    assert "@register" not in core.code and "def loss" in core.code  # decorator dropped
    assert "fw/registry.py" not in by_path  # so its registry (and ray) is never pulled in
    kinds = {b["name"]: b for b in core.bindings}
    assert kinds["logger"]["kind"] == "stub" and kinds["logger"]["module"] == "loguru"
    assert kinds["AlgoConfig"]["module"] == "fw.config.algo"  # followed through `import *`
    spaces = _load({"modules": [m.to_dict() for m in modules]})
    import torch

    assert float(spaces["fw.core"]["loss"](torch.ones(3), object())) == 6.0


def test_an_unknown_import_is_a_clear_error(repo: tuple[Path, str]) -> None:
    root, head = repo
    files = GitFiles(root, parse_revision(f"x/fw@{head}:fw/bad.py::f()"))
    with pytest.raises(PinnedSourceError, match="needs 'import notalib' for notalib"):
        extract(files, "f")


def test_config_class_defaults_are_read_without_running(repo: tuple[Path, str]) -> None:
    root, head = repo
    files = GitFiles(root, parse_revision(f"x/fw@{head}:fw/cfg.py::f()"))
    keys = ("clip_ratio", "low", "kl_tau", "clip_ratio_c")
    assert class_defaults(files, "fw/cfg.py", "Actor", keys) == {
        "clip_ratio": 0.2,
        "low": 0.25,
        "kl_tau": 1e-3,
        "clip_ratio_c": 3.0,  # inherited from Base
    }
    with pytest.raises(RevisionError, match=r"Actor has no literal default for \['missing'\]"):
        class_defaults(files, "fw/cfg.py", "Actor", ("missing",))


def test_verl_defaults_come_from_its_actor_config() -> None:
    fw = registry()["verl"]
    rev = parse_revision(
        f"verl-project/verl@{fw.recorded_commit}:verl/trainer/ppo/core_algos.py::"
        "compute_policy_loss_dppo_tv(clip_ratio=0.15)"
    )
    ref = resolve_reference(rev)
    # verl reads clip_ratio only when clip_ratio_low/high are None; ActorConfig sets them 0.2
    assert ref.params["clip_ratio_low"] == ref.params["clip_ratio_high"] == 0.2
    assert ref.params["clip_ratio_c"] == 3.0 and ref.params["bypass_mode"] is False
    assert any("ActorConfig" in n or "config default" in n for n in ref.notes)
    config = fw.losslab_config(ref)
    assert config.params["anchor"] == config.params["weight_anchor"] == "recomputed"


def test_prime_rl_adv_tau_has_no_losslab_knob() -> None:
    fw = registry()["prime_rl"]
    rev = parse_revision(
        f"PrimeIntellect-ai/prime-rl@{fw.recorded_commit}:src/prime_rl/trainer/rl/loss.py::"
        "default_loss_fn(adv_tau=2.0)"
    )
    config = fw.losslab_config(resolve_reference(rev))
    assert config.loss is None and "adv_tau = 2.0" in config.reason

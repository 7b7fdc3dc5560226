"""Pinned source: read at a commit with git, extracted with ast, executed in a subprocess."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.fixtures import FixtureSpec, generate_fixture
from losslab.conformance.frameworks import rederive, resolve_reference
from losslab.conformance.metrics import compare
from losslab.conformance.pinned import (
    GitFiles,
    PinnedSourceError,
    extract,
    parse_sources,
    run_pinned,
)
from losslab.plan import parse_revision

from .conftest import SPINDLE_PATH, VERL_PATH, RefRepo

SMALL = FixtureSpec(n_seq=4, len_lo=12, len_hi=20, prompt_lo=3, prompt_hi=6, zero_adv_idx=1)


def _spindle(commit: str, args: str = "loss_name='ppo', clip 0.8/1.2") -> str:
    return f"modal-projects/spindle@{commit}:{SPINDLE_PATH}::_loss({args})"


def _verl(commit: str, mode: str = "dppo_binary_tv") -> str:
    return (
        f"sail-sg/Stable-RL@{commit}:{VERL_PATH}::compute_policy_loss_with_mask("
        f"loss_mode='{mode}', clip_ratio=0.15, clip_ratio_c=10)"
    )


def _sha_at(repo: RefRepo, commit: str, path: str) -> str:
    text = subprocess.run(
        ["git", "-C", str(repo.path), "show", f"{commit}:{path}"], capture_output=True, check=True
    ).stdout
    return hashlib.sha256(text).hexdigest()


def test_extraction_takes_only_what_the_function_uses(ref_repo: RefRepo) -> None:
    rev = parse_revision(_spindle(ref_repo.good))
    modules = extract(GitFiles(ref_repo.path, rev), "_loss", ("_loss_config",))
    by_path = {m.path: m for m in modules}
    assert set(by_path) == {"src/spindle/helpers.py", SPINDLE_PATH}
    assert by_path["src/spindle/helpers.py"].names == ["masked_negative_sum"]  # not `unused`
    assert set(by_path[SPINDLE_PATH].names) == {
        "RL_LOSSES",
        "SIGN",
        "_ratio",
        "_loss_config",
        "_loss",
    }
    assert by_path[SPINDLE_PATH].imports == ["import torch"]
    verl = extract(
        GitFiles(ref_repo.path, parse_revision(_verl(ref_repo.good))),
        "compute_policy_loss_with_mask",
    )
    core = next(m for m in verl if m.path == VERL_PATH)
    assert core.bindings == [
        {
            "name": "verl_F",
            "kind": "namespace",
            "module": "verl.utils.torch_functional",
            "attrs": ["masked_sum"],
        }
    ]


@pytest.mark.parametrize(
    "args", ["loss_name='ppo', clip 0.8/1.2", "loss_name='dppo', tv_threshold=0.15"]
)
def test_pinned_spindle_matches_rederivation(ref_repo: RefRepo, args: str) -> None:
    fixture = generate_fixture(SMALL)
    ref = resolve_reference(parse_revision(_spindle(ref_repo.good, args)))
    pinned = run_pinned(ref, ref_repo.path, fixture)
    ours = rederive(ref, fixture)
    # same float32 formula on the same packed row: equal up to summation order
    assert compare(pinned.loss, ours.loss).max_abs_error <= 1e-5 * max(1.0, abs(ours.loss))
    assert compare(pinned.grad_D, ours.grad_D).max_abs_error <= 1e-6
    assert np.allclose(pinned.per_sequence_loss, ours.per_sequence_loss, atol=1e-5)
    assert pinned.source["kind"] == "pinned_source"
    assert pinned.source["file_sha256"] == _sha_at(ref_repo, ref_repo.good, SPINDLE_PATH)
    assert "pinned source executed" in pinned.source["label"]


@pytest.mark.parametrize("mode", ["dppo_binary_tv", "ppo"])
def test_pinned_verl_style_matches_rederivation(ref_repo: RefRepo, mode: str) -> None:
    fixture = generate_fixture(SMALL)
    ref = resolve_reference(parse_revision(_verl(ref_repo.good, mode)))
    pinned = run_pinned(ref, ref_repo.path, fixture)
    ours = rederive(ref, fixture)
    assert compare(pinned.loss, ours.loss).max_abs_error <= 1e-5 * max(1.0, abs(ours.loss))
    assert compare(pinned.grad_D, ours.grad_D).max_abs_error <= 1e-6
    # the mask fired somewhere, so the comparison covers masked tokens too
    assert sum(int(b.sum()) for b in pinned.blocked_D) > 0


def test_the_pinned_commit_is_executed_not_head(ref_repo: RefRepo) -> None:
    fixture = generate_fixture(SMALL)
    good = run_pinned(
        resolve_reference(parse_revision(_spindle(ref_repo.good))), ref_repo.path, fixture
    )
    broken = run_pinned(
        resolve_reference(parse_revision(_spindle(ref_repo.broken))), ref_repo.path, fixture
    )
    assert broken.loss == pytest.approx(-good.loss)  # HEAD flips the sign


def test_bare_git_directory_is_accepted(ref_repo: RefRepo, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(ref_repo.path), str(bare)], check=True)
    fixture = generate_fixture(SMALL)
    ref = resolve_reference(parse_revision(_spindle(ref_repo.good)))
    assert run_pinned(ref, bare, fixture).loss == run_pinned(ref, ref_repo.path, fixture).loss


def test_commit_that_does_not_exist(ref_repo: RefRepo) -> None:
    text = _spindle("0123456789abcdef0123456789abcdef01234567")
    with pytest.raises(PinnedSourceError, match="commit 0123456789abcdef.* does not exist") as info:
        run_pinned(resolve_reference(parse_revision(text)), ref_repo.path, generate_fixture(SMALL))
    assert repr(text) in str(info.value)


def test_function_that_is_missing(ref_repo: RefRepo) -> None:
    rev = parse_revision(
        f"modal-projects/spindle@{ref_repo.good}:{VERL_PATH}::_loss(loss_name='ppo')"
    )
    with pytest.raises(PinnedSourceError, match="function _loss is not defined at the top level"):
        run_pinned(resolve_reference(rev), ref_repo.path, generate_fixture(SMALL))


def test_file_that_is_missing(ref_repo: RefRepo) -> None:
    rev = parse_revision(
        f"modal-projects/spindle@{ref_repo.good}:src/nowhere.py::_loss(loss_name='ppo')"
    )
    with pytest.raises(PinnedSourceError, match="file src/nowhere.py does not exist"):
        run_pinned(resolve_reference(rev), ref_repo.path, generate_fixture(SMALL))


def test_runtime_import_outside_repo_and_allow_list_is_refused(ref_repo: RefRepo) -> None:
    rev = parse_revision(
        f"sail-sg/Stable-RL@{ref_repo.good}:net/core.py::"
        "compute_policy_loss_with_mask(loss_mode='ppo', clip_ratio=0.2)"
    )
    with pytest.raises(PinnedSourceError, match=r"needs 'import urllib.request'"):
        run_pinned(resolve_reference(rev), ref_repo.path, generate_fixture(SMALL))


def test_not_a_git_checkout(tmp_path: Path, ref_repo: RefRepo) -> None:
    ref = resolve_reference(parse_revision(_spindle(ref_repo.good)))
    with pytest.raises(PinnedSourceError, match="is not a git checkout"):
        run_pinned(ref, tmp_path, generate_fixture(SMALL))


def test_parse_sources(tmp_path: Path) -> None:
    assert parse_sources([f"a/b={tmp_path}"]) == {"a/b": tmp_path}
    with pytest.raises(ValueError, match="expected owner/repo=PATH"):
        parse_sources(["a/b"])
    with pytest.raises(ValueError, match="does not exist"):
        parse_sources([f"a/b={tmp_path / 'nope'}"])


def test_spindle_config_given_as_dict_reaches_the_reference(ref_repo: RefRepo) -> None:
    fixture = generate_fixture(SMALL)
    args = "loss_name='ppo', loss_config={'clip_low_threshold': 0.7, 'clip_high_threshold': 1.3}"
    ref = resolve_reference(parse_revision(_spindle(ref_repo.good, args)))
    assert ref.params["loss_config"] == {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    pinned = run_pinned(ref, ref_repo.path, fixture)
    assert compare(pinned.grad_D, rederive(ref, fixture).grad_D).max_abs_error <= 1e-6
    # and it differs from the 0.8/1.2 default, so the config did travel
    default = rederive(resolve_reference(parse_revision(_spindle(ref_repo.good))), fixture)
    assert compare(pinned.grad_D, default.grad_D).max_abs_error > 1e-3

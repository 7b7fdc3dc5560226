"""Golden files: check against re-derivations, named failures, make from pinned source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.conformance.fixtures import FixtureSpec
from losslab.conformance.golden import GoldenFileError, check_golden, make_golden

from .conftest import SPINDLE_PATH, VERL_PATH, RefRepo

SMALL = FixtureSpec(n_seq=4, len_lo=12, len_hi=20, prompt_lo=3, prompt_hi=6, zero_adv_idx=1)


def test_team_golden_file_passes_every_output(golden_tinker_ppo_dppo: Path) -> None:
    report = check_golden(golden_tinker_ppo_dppo)
    assert report.passed and report.generator_reproduces
    assert len(report.outputs) == 11
    by_name = {o.name: o for o in report.outputs}
    # checked against losslab.losses configured like Spindle (one tau, no cap, no guard)
    assert by_name["spindle_dppo_default_tv0.1"].reference.startswith(
        "spindle dppo vs losslab.losses dppo_binary_tv(low=0.1, high=0.1,"
    )
    assert by_name["stable_rl_dppo_binary_tv"].count_golden == 151


def _tampered(src: Path, tmp_path: Path, edit) -> Path:
    data = json.loads(src.read_text())
    edit(data)
    out = tmp_path / "golden.json"
    out.write_text(json.dumps(data))
    return out


def test_a_changed_gradient_fails_and_names_the_output(
    golden_tinker_ppo_dppo: Path, tmp_path: Path
) -> None:
    def edit(data: dict) -> None:
        row = data["outputs"]["stable_rl_ppo"]["grad_current_logprobs"][0]
        t = next(i for i, g in enumerate(row) if g != 0)
        row[t] = 0.0  # as if this token had been masked

    report = check_golden(_tampered(golden_tinker_ppo_dppo, tmp_path, edit))
    failed = [o for o in report.outputs if not o.passed]
    assert [o.name for o in failed] == ["stable_rl_ppo"]
    assert failed[0].grad_error > 1e-6 and failed[0].only_golden  # a token set differs


def test_unmappable_output_is_named(golden_tinker_ppo_dppo: Path, tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["outputs"]["mystery_loss"] = data["outputs"]["spindle_ppo"]

    report = check_golden(_tampered(golden_tinker_ppo_dppo, tmp_path, edit))
    (bad,) = [o for o in report.outputs if not o.passed]
    assert bad.name == "mystery_loss" and "cannot map" in bad.error and not report.passed


def test_loss_tolerance_is_settable(golden_tinker_ppo_dppo: Path, tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        out = data["outputs"]["spindle_dro"]
        out["loss"] += 1e-3 * out["float64_check"]["loss_term_abs_sum_float64"]

    path = _tampered(golden_tinker_ppo_dppo, tmp_path, edit)
    assert not check_golden(path).passed
    assert check_golden(path, loss_tolerance=2e-3).passed
    with pytest.raises(ValueError, match="loss tolerance = -1"):
        check_golden(path, loss_tolerance=-1)


def test_malformed_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(GoldenFileError, match="'sequences' is missing"):
        check_golden(bad)
    with pytest.raises(GoldenFileError, match="does not exist"):
        check_golden(tmp_path / "none.json")


def test_make_from_pinned_source_round_trips(ref_repo: RefRepo, tmp_path: Path) -> None:
    revisions = [
        f"modal-projects/spindle@{ref_repo.good}:{SPINDLE_PATH}::_loss(loss_name='dppo', tv_threshold=0.15)",
        f"sail-sg/Stable-RL@{ref_repo.good}:{VERL_PATH}::compute_policy_loss_with_mask("
        "loss_mode='ppo', clip_ratio=0.2, clip_ratio_c=10)",
    ]
    sources = {"modal-projects/spindle": ref_repo.path, "sail-sg/Stable-RL": ref_repo.path}
    out = tmp_path / "made.json"
    data = make_golden(revisions, sources, out, spec=SMALL)
    assert set(data["outputs"]) == {"spindle_dppo", "stable_rl_ppo"}
    for entry in data["outputs"].values():
        assert entry["reference"]["kind"] == "pinned_source"
        assert entry["reference"]["commit"] == ref_repo.good
    report = check_golden(out)
    assert report.passed and report.generator_reproduces


def test_make_without_source_needs_explicit_rederivation(tmp_path: Path) -> None:
    rev = (
        "sail-sg/Stable-RL@c6af1d119c0fe30d16dd9a837d35fdf695acd226:verl/trainer/ppo/"
        "core_algos.py::compute_policy_loss_with_mask(loss_mode='dppo_binary_kl', clip_ratio=0.05)"
    )
    with pytest.raises(ValueError, match="no --source for sail-sg/Stable-RL and its pinned source"):
        make_golden([rev], {}, tmp_path / "x.json", spec=SMALL)
    data = make_golden([rev], {}, tmp_path / "x.json", spec=SMALL, allow_rederivation=True)
    assert data["outputs"]["stable_rl_dppo_binary_kl"]["reference"]["kind"] == "rederivation"
    assert check_golden(tmp_path / "x.json").passed

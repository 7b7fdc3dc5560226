"""`run_preflight` on the user's plan: report fields, pinned sources, fallback, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.conformance.preflight import (
    PreflightError,
    preflight_checks,
    run_preflight,
    write_report,
)

from .conftest import SPINDLE_PATH, VERL_PATH, RefRepo

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


@pytest.fixture(scope="module")
def report() -> dict:
    return run_preflight(PLAN, allow_rederivation=True)


def test_check_rows_are_set_a_then_the_stress_fixture(report: dict) -> None:
    (path,) = report["paths"]
    rows = preflight_checks(report)
    names = [*path["checks"], *(f"stress_{k}" for k in path["stress"]["checks"])]
    properties = [
        f"properties.{arm}.{check}" for arm, checks in report["properties"]["arms"].items()
        for check in checks
    ]  # fmt: skip
    assert [r.name for r in rows] == [
        *(f"grpo_dppo_custom_loss.{n}" for n in names),
        *properties,
        "properties.arms_differ",
    ]
    # 4 on set A, 2 on the stress set, then 6 properties per arm (both arms read policy inputs)
    assert all(r.passed for r in rows) and len(rows) == 6 + 2 * 6 + 1
    grad = next(r for r in rows if r.name.endswith(".reference_gradient"))
    assert grad.bound == "atol 1e-05, rtol 0.001, min_cosine 0.9999"  # the plan's tolerance
    assert grad.measured == {
        k: path["errors"]["reference_gradient"][k]
        for k in ("max_abs_error", "relative_l2_error", "cosine_similarity")
    }


def test_user_plan_passes_with_rederivations(report: dict) -> None:
    assert report["passed"] and report["required"] is True
    (path,) = report["paths"]
    assert path["id"] == "grpo_dppo_custom_loss"
    assert set(path["checks"]) == {
        "baseline_loss",
        "baseline_gradient",
        "reference_loss",
        "reference_gradient",
    }
    assert all(c["passed"] for c in path["checks"].values())
    # the tolerance used is the plan's block, recorded per check
    assert path["checks"]["reference_gradient"]["tolerance"] == {
        "atol": 1e-05,
        "rtol": 0.001,
        "min_cosine": 0.9999,
    }
    for src in path["reference_sources"].values():
        assert src["kind"] == "rederivation" and "re-derivation" in src["label"]


def test_report_has_the_seed_report_fields(report: dict, shared_dir: Path) -> None:
    seed = json.loads((shared_dir / "seeds" / "preflight_report.json").read_text())
    ours, theirs = report["paths"][0], seed["paths"][0]
    assert set(theirs) <= set(ours)
    assert set(theirs["fixed_input"]) <= set(ours["fixed_input"])
    assert set(theirs["errors"]) == set(ours["errors"])
    for name, metrics in theirs["errors"].items():
        assert set(metrics) == set(ours["errors"][name])
    assert ours["baseline_revision"] == theirs["baseline_revision"]
    assert ours["reference_revision"] == theirs["reference_revision"]
    assert ours["implementation_revision"].startswith("losslab ")
    assert "sha256" in ours["implementation_revision"]


def test_fired_fractions_are_stated(report: dict) -> None:
    fired = report["paths"][0]["fired"]
    # set A: GRPO clip 254/824 loss tokens, DPPO-TV mask 151/824 (team notes §7; golden counts)
    assert fired["baseline"]["ours"]["tokens"] == 254
    assert fired["baseline"]["ours"]["fraction"] == pytest.approx(254 / 824)
    assert fired["treatment"]["ours"]["tokens"] == 151
    assert fired["treatment"]["reference"]["tokens"] == 151
    diffs = report["paths"][0]["token_set_differences"]
    assert diffs["reference"]["only_ours"] == diffs["reference"]["only_reference"] == 0


def test_value_convention_is_matched_and_stated(report: dict) -> None:
    path = report["paths"][0]
    assert "surrogate='logprob'" in path["implementation"]["treatment"]["value_convention_loss"]
    assert "Stable-RL value convention" in path["compared"]["reference_loss"]
    assert "batch_num_tokens=1" in path["normalization"]


def test_write_report_is_atomic_json(report: dict, tmp_path: Path) -> None:
    out = write_report(report, tmp_path / "sub" / "report.json")
    assert json.loads(out.read_text())["passed"] is True
    assert [p.name for p in out.parent.iterdir()] == ["report.json"]  # no temp file left


def _plan_with(tmp_path: Path, baseline: str, reference: str) -> Path:
    plan = json.loads(PLAN.read_text())
    path = plan["correctness_preflight"]["paths"][0]
    path["baseline_revision"], path["reference_revision"] = baseline, reference
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(plan))
    return out


def test_pinned_sources_are_executed_and_labelled(ref_repo: RefRepo, tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        f"modal-projects/spindle@{ref_repo.good}:{SPINDLE_PATH}::_loss(loss_name='ppo', clip 0.8/1.2)",
        f"sail-sg/Stable-RL@{ref_repo.good}:{VERL_PATH}::compute_policy_loss_with_mask("
        "loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)",
    )
    sources = {"modal-projects/spindle": ref_repo.path, "sail-sg/Stable-RL": ref_repo.path}
    rep = run_preflight(plan, sources={**sources, "other/repo": ref_repo.path})
    assert rep["passed"] and rep["unused_sources"] == ["other/repo"]
    for src in rep["paths"][0]["reference_sources"].values():
        assert src["kind"] == "pinned_source" and src["commit"] == ref_repo.good
        assert len(src["file_sha256"]) == 64


def test_broken_pinned_commit_fails_the_preflight(ref_repo: RefRepo, tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        f"modal-projects/spindle@{ref_repo.broken}:{SPINDLE_PATH}::_loss(loss_name='ppo', clip 0.8/1.2)",
        json.loads(PLAN.read_text())["correctness_preflight"]["paths"][0]["reference_revision"],
    )
    rep = run_preflight(
        plan, sources={"modal-projects/spindle": ref_repo.path}, allow_rederivation=True
    )
    checks = rep["paths"][0]["checks"]
    assert not rep["passed"] and not checks["baseline_loss"]["passed"]
    assert checks["reference_loss"]["passed"]


def test_missing_commit_falls_back_or_fails_when_strict(ref_repo: RefRepo) -> None:
    # the user's plan pins spindle@e58ebef1, which the test repository does not have
    rep = run_preflight(
        PLAN, sources={"modal-projects/spindle": ref_repo.path}, allow_rederivation=True
    )
    src = rep["paths"][0]["reference_sources"]["baseline"]
    assert src["kind"] == "rederivation" and "does not exist" in src["fallback_reason"]
    assert src["label"].startswith("FALLBACK")
    with pytest.raises(PreflightError, match="e58ebef1.*does not exist"):
        run_preflight(
            PLAN,
            sources={"modal-projects/spindle": ref_repo.path},
            strict_sources=True,
            allow_rederivation=True,
        )


def test_unknown_reference_is_a_clear_error(tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        "someone/else@abcdef1:x.py::f(a=1)",
        json.loads(PLAN.read_text())["correctness_preflight"]["paths"][0]["reference_revision"],
    )
    with pytest.raises(Exception, match=r"someone/else@abcdef1:x.py::f\(a=1\)"):
        run_preflight(plan)

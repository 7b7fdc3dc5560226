"""The report's answers to a researcher's questions: where each preflight reference came from, the
base model's row, and the flipped items; checked in the HTML and in headless Chromium.

The run directory comes from the fake components (tests/runner), with its preflight.json replaced
by the real correctness preflight of the local example plan (losslab's re-derivation, since no
`--source` is given), so the provenance section reads the artifact the runner really writes.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from losslab.conformance.preflight import preflight_phase
from losslab.report import build_report, collect
from losslab.report.preflight import preflight_summary
from losslab.runner import run_plan
from losslab.runner.components import DefaultComponents
from losslab.runner.rundir import RunDir
from runner._fake_components import N_EVAL, factory, write_fake_plan

from .test_report import _dump_dom

EXAMPLE_PLAN = (
    Path(__file__).resolve().parents[2] / "examples" / "arithmetic_dppo_vs_grpo_local.json"
)


@pytest.fixture(scope="module")
def real_preflight() -> dict[str, Any]:
    comp = DefaultComponents(EXAMPLE_PLAN, "local")
    return preflight_phase(comp.plan, comp.losses).record()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, real_preflight: dict[str, Any]) -> Path:
    tmp = tmp_path_factory.mktemp("sections")
    run_plan(
        write_fake_plan(tmp / "plan.json"),
        out=tmp / "run",
        quiet=True,
        components_factory=factory(),
    )
    (tmp / "run" / "preflight.json").write_text(json.dumps(real_preflight))
    # re-entered in the manifest's ledger: the report refuses an artifact edited behind its back
    RunDir(tmp / "run").record_artifact(tmp / "run" / "preflight.json")
    build_report(tmp / "run")
    return tmp / "run"


def test_rederivation_is_named_on_each_side(real_preflight: dict[str, Any]) -> None:
    summary = preflight_summary(real_preflight)
    assert summary is not None
    lines = summary["provenance"]
    assert [(r["side"], r["role"]) for r in lines] == [
        ("baseline", "baseline"),
        ("reference", "treatment"),
    ]
    path = real_preflight["paths"][0]
    for row in lines:
        assert row["executed"] is False
        assert "pinned source NOT executed" in row["summary"]
        # the preflight's own provenance line (conformance.preflight) is shown as written
        assert row["summary"] == path["provenance"][row["side"]]["summary"]


def test_derived_line_without_a_provenance_block(real_preflight: dict[str, Any]) -> None:
    """An artifact without `provenance` (older preflights): derived from reference_sources."""
    report = _without_provenance(real_preflight)
    rows = preflight_summary(report)["provenance"]  # type: ignore[index]
    for row in rows:
        assert row["executed"] is False
        assert row["summary"].startswith("re-derivation by losslab, pinned source NOT executed")
    assert "sail-sg/Stable-RL@c6af1d119c0fe30d16dd9a837d35fdf695acd226" in rows[1]["summary"]


def _without_provenance(report: dict[str, Any]) -> dict[str, Any]:
    report = copy.deepcopy(report)
    report.pop("provenance", None)
    for path in report["paths"]:
        path.pop("provenance", None)
    return report


def test_errors_are_numbers_with_their_tolerance_and_result(real_preflight: dict[str, Any]) -> None:
    summary = preflight_summary(real_preflight)
    assert summary is not None
    path = real_preflight["paths"][0]
    by_check = {m["check"]: m for m in summary["metrics"]}
    # set A's checks, then the stress fixture's (the treatment vs its reference)
    stress = path["stress"]
    expected = {
        f"{path['id']}.{name}": (chk, path["errors"][name]) for name, chk in path["checks"].items()
    }
    expected.update(
        {
            f"{path['id']}.stress_{name}": (chk, stress["errors"][name])
            for name, chk in stress["checks"].items()
        }
    )
    assert stress["checks"], "the preflight checks the stress fixture"
    assert set(by_check) == set(expected)
    for check, (chk, err) in expected.items():
        row = by_check[check]
        assert row["max_abs_error"] == err["max_abs_error"]
        assert row["passed"] is chk["passed"]
        assert row["elementwise_passed"] is (chk["violations"] == 0)
    # the plan's tolerances (examples/arithmetic...json): loss atol 1e-05 rtol 1e-04; gradients
    # also min_cosine 0.9999
    assert by_check[f"{path['id']}.reference_loss"]["tolerance"] == (
        "|err| <= 1e-05 + 0.0001 * |reference|"
    )
    assert by_check[f"{path['id']}.reference_gradient"]["tolerance"].endswith("cosine >= 0.9999")
    fired = {r["arm role"]: r for r in summary["fired"]}
    assert (
        fired["treatment"]["ours: fraction of loss tokens"]
        == (path["fired"]["treatment"]["ours"]["fraction"])
    )


def test_executed_pinned_source_line(real_preflight: dict[str, Any]) -> None:
    """The fields losslab.conformance.pinned.run_pinned records for an executed source."""
    report = _without_provenance(real_preflight)
    source = report["paths"][0]["reference_sources"]["reference"]
    source.update(kind="pinned_source", commit="c" * 40, file_sha256="ab" * 32)
    row = preflight_summary(report)["provenance"][1]  # type: ignore[index]
    assert row["executed"] is True
    assert (
        row["summary"]
        == f"executed pinned source sail-sg/Stable-RL@{'c' * 40}, file sha256 {'ab' * 32}"
    )


def test_a_provenance_block_in_the_artifact_is_used_as_written(
    real_preflight: dict[str, Any],
) -> None:
    report = _without_provenance(real_preflight)
    report["provenance"] = {
        "baseline": {"summary": "re-derivation by losslab, pinned source NOT executed (spindle)"},
        "reference": {"summary": "executed pinned source sail-sg/Stable-RL@abc, file sha256 12"},
    }
    rows = preflight_summary(report)["provenance"]  # type: ignore[index]
    assert [(r["summary"], r["executed"]) for r in rows] == [
        ("re-derivation by losslab, pinned source NOT executed (spindle)", False),
        ("executed pinned source sail-sg/Stable-RL@abc, file sha256 12", True),
    ]


def test_html_has_no_raw_json_in_check_cells(run_dir: Path) -> None:
    html = (run_dir / "report.html").read_text()
    assert '{"' not in html and "{&quot;" not in html
    assert html.count('class="not-executed"') == 2 and "WARNING:" in html


def test_flipped_items_list_every_discordant_pair(run_dir: Path) -> None:
    facts = collect(run_dir)
    (group,) = facts["flipped"]
    p = facts["paired"]
    kinds = [i["kind"] for i in group["items"]]
    assert (kinds.count("b"), kinds.count("c")) == (p["b"], p["c"])
    treat = {r["id"]: r for r in map(json.loads, (run_dir / "eval_treat.jsonl").open())}
    for item in group["items"]:
        row = treat[item["id"]]
        assert item["question"] == row["question"] and item["answer"] == row["answer"]
        assert item["treatment"]["completion"] == row["completion"]
        assert item["treatment"]["prediction"] == row["prediction"]
        assert item["treatment"]["correct"] == (item["kind"] == "b")
    assert p["n"] == N_EVAL


def test_chromium_renders_base_row_provenance_and_flipped_items(
    run_dir: Path, tmp_path: Path
) -> None:
    dom = _dump_dom(run_dir / "report.html", tmp_path)
    facts = collect(run_dir)
    flipped = len(facts["flipped"][0]["items"])
    assert flipped > 0  # the fake's arms disagree on some of the 40 items
    assert 'data-base-row="1"' in dom
    assert 'data-provenance-lines="2"' in dom and 'data-provenance-warnings="2"' in dom
    assert f'data-flipped-items="{flipped}"' in dom
    assert "pinned source NOT executed" in dom


def test_chromium_counts_can_fail(run_dir: Path, tmp_path: Path) -> None:
    """A page without the base row and with one flipped item removed is counted as such."""
    html = (run_dir / "report.html").read_text()
    html = html.replace('class="base-row"', 'class="other-row"')
    start = html.index('<details class="flip"')
    end = html.index("</details>", start) + len("</details>")
    page = tmp_path / "edited.html"
    page.write_text(html[:start] + html[end:])
    dom = _dump_dom(page, tmp_path)
    flipped = len(collect(run_dir)["flipped"][0]["items"])
    assert 'data-base-row="0"' in dom and f'data-flipped-items="{flipped - 1}"' in dom


def test_report_of_an_old_run_without_base_model_says_so(run_dir: Path, tmp_path: Path) -> None:
    copy_dir = tmp_path / "old"
    shutil.copytree(run_dir, copy_dir)
    (copy_dir / "eval_base_model.jsonl").unlink()
    manifest = json.loads((copy_dir / "manifest.json").read_text())
    del manifest["artifacts"]  # an old run: made before the manifest kept a ledger of artifacts
    (copy_dir / "manifest.json").write_text(json.dumps(manifest))
    build_report(copy_dir)
    html = (copy_dir / "report.html").read_text()
    assert "The base model was not evaluated in this run." in html

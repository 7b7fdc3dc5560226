"""report.json / report.html from a run directory, and the page rendered in headless Chromium.

The run directory comes from the runner with the fake components of tests/runner (a few ms of
training), so these tests check the report, not the training.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from losslab.report import build_report, collect
from losslab.runner import CheckFailed, run_plan

# tests/ is on sys.path (tests/conftest.py is rootless), so the runner tests import as `runner`
from runner._fake_components import N_EVAL, factory, write_fake_plan

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    plan = write_fake_plan(tmp / "plan.json")
    run_plan(plan, out=tmp / "run", quiet=True, components_factory=factory())
    return tmp / "run"


def _chromium() -> str:
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    pytest.skip("no Chromium on PATH (tried " + ", ".join(CHROMIUM_NAMES) + "); CI installs it")


def _dump_dom(html: Path, tmp_path: Path) -> str:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=5000",
        "--dump-dom",
        html.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_report_json_holds_the_facts(run_dir: Path) -> None:
    facts = json.loads((run_dir / "report.json").read_text())
    assert facts["status"]["complete"] is True
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert facts["verdict"] == verdict
    # the paired table counts the same discordant pairs as the decision (fake decide: b, c)
    assert (facts["paired"]["b"], facts["paired"]["c"]) == (verdict["b"], verdict["c"])
    p = facts["paired"]
    assert p["both_right"] + p["b"] + p["c"] + p["both_wrong"] == N_EVAL
    for arm in ("base", "treat"):
        rows = [json.loads(x) for x in (run_dir / f"eval_{arm}.jsonl").read_text().splitlines()]
        assert facts["evaluation"][arm]["accuracy"] == sum(r["correct"] for r in rows) / N_EVAL
        assert len(facts["training"]["curves"]["loss/value"][arm]) == 4  # 4 steps per arm
    assert set(facts["plots"]) == {
        "curve-reward-mean",
        "curve-loss-clip-fraction",
        "curve-dppo-mask-fraction",
        "curve-policy-drift-vs-sampler-q90",
        "curve-loss-value",
        "eval-accuracy",
        "feasibility",
    }
    assert (
        facts["environment"]["plan_sha256"]
        == json.loads((run_dir / "manifest.json").read_text())["plan_sha256"]
    )
    assert facts["pilot"]["steps"] == 2 and "continued from the pilot" in facts["pilot"]["note"]


def test_report_is_self_contained(run_dir: Path) -> None:
    html = (run_dir / "report.html").read_text()
    # no external fetch of any kind: every src/href is inline data
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", html)
    assert "http://" not in html and "https://" not in html
    assert html.count('<img class="plot"') == 7


def test_rebuild_is_deterministic(run_dir: Path, tmp_path: Path) -> None:
    """`losslab report` twice on the same artifacts gives byte-identical files (PNGs included)."""
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    build_report(copy)
    first = ((copy / "report.html").read_bytes(), (copy / "report.json").read_bytes())
    build_report(copy)
    assert ((copy / "report.html").read_bytes(), (copy / "report.json").read_bytes()) == first


def test_report_of_stopped_run_says_where_it_stopped(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", gate_min=0.5)
    with pytest.raises(CheckFailed):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    facts = collect(tmp_path / "run")
    assert facts["status"]["stopped_at"] == "gate"
    assert facts["verdict"] is None and facts["evaluation"] == {}
    html = (tmp_path / "run" / "report.html").read_text()
    assert "No verdict: the run did not reach the decision rule." in html


def test_chromium_renders_verdict_and_every_plot(run_dir: Path, tmp_path: Path) -> None:
    dom = _dump_dom(run_dir / "report.html", tmp_path)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert f"Verdict: {verdict['verdict']}" in dom
    # the page's script marks each decoded image; 7 plots, all decoded by the browser
    assert 'data-plots-rendered="7/7"' in dom
    assert dom.count('data-rendered="yes"') == 7 and 'data-rendered="no"' not in dom


def test_chromium_flags_a_broken_plot(run_dir: Path, tmp_path: Path) -> None:
    """The render check can fail: a corrupted PNG is reported as not rendered."""
    html = (run_dir / "report.html").read_text()
    broken = re.sub(r"base64,[A-Za-z0-9+/=]{40}", "base64,AAAAAAAAAAAAAAAAAAAAAAAA", html, count=1)
    page = tmp_path / "broken.html"
    page.write_text(broken)
    dom = _dump_dom(page, tmp_path)
    assert 'data-plots-rendered="6/7"' in dom and dom.count('data-rendered="no"') == 1

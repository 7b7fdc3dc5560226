"""The report's pilot-diagnostics section: the mismatch-vs-drift table, the effective group size
and the alignment check, from the pilot/diagnostics.json the pilot phase writes.

The run directory comes from the fake components (tests/runner), whose trainer is not the
engine's arm loop (its section says so); its diagnostics file is then replaced by the real
`engine.pilot_diagnostics` of two pilot steps of the engine's fakes (tests/engine/_fakes.py):
the trainer 0.3 nats above the sampler before any update (mismatch, no drift) and a sampler
that returns the same two completions for all 4 samples of a group.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine._fakes import FakeTrainingClient, ppo_clip_loss, tv_mask_loss
from engine.test_rl import AddTask, arm
from losslab.engine import ArmLoop, alignment_check, pilot_diagnostics, train_steps
from losslab.plan import GATE_METRICS
from losslab.report import build_report, collect
from losslab.runner import run_plan
from runner._fake_components import factory, write_fake_plan


def _engine_diagnostics() -> dict:
    client = FakeTrainingClient(completions=["2", "3"], mismatch=0.3, shifts=[0.0])
    config = arm("dppo", tv_mask_loss(0.1), side_losses={"baseline": ppo_clip_loss(0.2)})
    rows = list(train_steps(ArmLoop(client, AddTask(), config), 0, 2))
    diag = {"available": True, **pilot_diagnostics(rows, GATE_METRICS, group_size=4, update=2)}
    diag["alignment"] = alignment_check(diag["mismatch"]).to_dict()
    return diag


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("pilot-section")
    run_plan(
        write_fake_plan(tmp / "plan.json"),
        out=tmp / "run",
        quiet=True,
        components_factory=factory(),
    )
    return tmp / "run"


def test_a_trainer_without_engine_rows_says_why(run_dir: Path) -> None:
    facts = collect(run_dir)
    assert facts["pilot_diagnostics"]["available"] is False
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'id="pilot-diagnostics"' in html
    assert "carry no first-update sampler/trainer gap" in html


def test_section_shows_mismatch_vs_drift_and_the_effective_group(run_dir: Path, tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "pilot" / "diagnostics.json").write_text(json.dumps(_engine_diagnostics()))
    build_report(run)
    facts = json.loads((run / "report.json").read_text())
    rows = {r["metric"]: r for r in facts["pilot_diagnostics"]["trust_region"]}
    # mismatch only: log r = 0.3 at update 1 already drops the A > 0 half (TV |dp| = 0.1287 >
    # 0.1, r = 1.35 > 1.2), and no drift adds to it at update 2 -> share 1
    assert rows["dppo_masked_token_fraction"]["mismatch_only"] == pytest.approx(0.5)
    assert rows["grpo_clip_fraction"]["acted_because"] == "mostly mismatch"
    html = (run / "report.html").read_text(encoding="utf-8")
    section = html.split('id="pilot-diagnostics"', 1)[1].split("</section>", 1)[0]
    table = section.split('id="pilot-mismatch-vs-drift"', 1)[1].split("</table>", 1)[0]
    assert "update 1: mismatch only" in table and "update 2: mismatch + drift" in table
    assert table.count("mostly mismatch") == 3  # the 2 gate fractions and the engine's drift
    groups = section.split('id="pilot-groups"', 1)[1].split("</table>", 1)[0]
    # 2 distinct completions among the 4 of each group: effective G 2 of the planned 4
    assert "<td>planned group size G</td><td>4</td>" in groups
    assert "<td>effective group size (distinct completions), mean</td><td>2</td>" in groups
    assert "effective group size is below the plan" in section
    # every sampler log-prob of the fake is -1, so one position out of step the gap is the same
    # 0.3: the check cannot confirm the alignment and says so
    assert "Alignment (ratio is 1 at the trained positions)" in section
    alignment = facts["pilot_diagnostics"]["alignment"]
    assert alignment["passed"] is False and "cannot be confirmed" in alignment["note"]

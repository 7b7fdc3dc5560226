"""The base-model evaluation, several seeds, and the optional tracker mirror, on the fake components
(tests/runner/_fake_components.py: a tiny torch model, milliseconds per step)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from losslab.runner import RunError, RunInterrupted, run_plan
from losslab.runner.checkpoint import seed_everything
from losslab.runner.phases.evaluation import EVAL_SEED_OFFSET

from ._fake_components import FakeComponents, factory, write_fake_plan


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_base_model_is_the_untrained_policy_evaluated_once(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    made: list[FakeComponents] = []
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory(record=made))
    assert made[0].calls["evaluate"] == 3  # the base model once, then each arm
    rows = _jsonl(tmp_path / "run" / "eval_base_model.jsonl")
    # the same seeds the runner uses: the first arm's seed for the weights, + the eval offset
    fresh = FakeComponents(plan, "local")
    seed_everything(7)
    trainer = fresh.make_trainer("base")
    seed_everything(7 + EVAL_SEED_OFFSET)
    assert rows == json.loads(json.dumps(fresh.evaluate("base", trainer).artifact))
    facts = json.loads((tmp_path / "run" / "report.json").read_text())
    base = facts["base_evaluation"]
    assert base["accuracy"] == sum(r["correct"] for r in rows) / len(rows)
    for arm in ("base", "treat"):
        arm_rows = _jsonl(tmp_path / "run" / f"eval_{arm}.jsonl")
        vs = base["versus_base"][arm]
        # change vs base = arm accuracy - base accuracy on the same 40 items; b/c its discordants
        assert vs["estimate"] == pytest.approx(
            (sum(r["correct"] for r in arm_rows) - sum(r["correct"] for r in rows)) / len(rows)
        )
        assert vs["b"] - vs["c"] == round(vs["estimate"] * len(rows))
        assert vs["deciding"] is False and vs["ci"][0] <= vs["estimate"] <= vs["ci"][1]
    html = (tmp_path / "run" / "report.html").read_text()
    assert 'id="base-row"' in html and "change vs base model" in html


def test_interrupted_evaluation_resumes_without_redoing_the_base_model(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run_plan(plan, out=tmp_path / "reference", quiet=True, components_factory=factory())
    with pytest.raises(RunInterrupted):  # Ctrl-C during the first arm's evaluation
        run_plan(
            plan, out=tmp_path / "run", quiet=True, components_factory=factory(interrupt_eval_at=2)
        )
    base = (tmp_path / "run" / "eval_base_model.jsonl").read_bytes()
    made: list[FakeComponents] = []
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory(record=made))
    assert made[0].calls["evaluate"] == 2  # both arms; the base model's file was kept
    assert (tmp_path / "run" / "eval_base_model.jsonl").read_bytes() == base
    for name in ("eval_base_model.jsonl", "eval_base.jsonl", "eval_treat.jsonl", "verdict.json"):
        assert (tmp_path / "run" / name).read_bytes() == (
            tmp_path / "reference" / name
        ).read_bytes()


def test_an_arm_may_not_be_named_base_model(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", arms=["base_model", "treat"])
    with pytest.raises(RunError, match="an arm is named 'base_model'"):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FakeComponents]:
    tmp = tmp_path_factory.mktemp("seeds")
    plan = write_fake_plan(tmp / "plan.json", seeds=[7, 8])
    made: list[FakeComponents] = []
    run_plan(plan, out=tmp / "run", quiet=True, components_factory=factory(record=made))
    return tmp / "run", made[0]


def test_two_seeds_train_one_pair_per_seed(two_seeds: tuple[Path, FakeComponents]) -> None:
    run, comp = two_seeds
    units = ("base", "treat", "base.seed8", "treat.seed8")
    assert comp.calls["steps"] == 4 * 4  # 4 units x 4 steps, the pilot reused by treat
    assert comp.calls["evaluate"] == 1 + 4
    first_loss = {u: _jsonl(run / "arms" / u / "metrics.jsonl")[0]["loss/value"] for u in units}
    # step 0's loss is computed before any update, from the seed's initial weights and batch:
    # equal within a seed's pair (shared state and data), different across seeds
    assert first_loss["base"] == first_loss["treat"]
    assert first_loss["base.seed8"] == first_loss["treat.seed8"]
    assert first_loss["base"] != first_loss["base.seed8"]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["schedule"]["units"]["treat.seed8"] == {"arm": "treat", "seed": 8}


def test_two_seeds_verdict_has_per_seed_and_pooled_results(
    two_seeds: tuple[Path, FakeComponents],
) -> None:
    run, _ = two_seeds
    verdict = json.loads((run / "verdict.json").read_text())
    assert [r["seed"] for r in verdict["per_seed"]] == [7, 8]
    per_seed_estimates = []
    pairs = [("treat", "base"), ("treat.seed8", "base.seed8")]
    for r, (t, b) in zip(verdict["per_seed"], pairs, strict=True):
        t_rows, b_rows = _jsonl(run / f"eval_{t}.jsonl"), _jsonl(run / f"eval_{b}.jsonl")
        est = (sum(x["correct"] for x in t_rows) - sum(x["correct"] for x in b_rows)) / 40
        assert r["estimate"] == pytest.approx(est)
        per_seed_estimates.append(est)
    # deciding: the plan's rule on per-item means over the 2 seeds = the mean of the two estimates
    assert verdict["estimate"] == pytest.approx(sum(per_seed_estimates) / 2)
    assert verdict["method"] == "paired_hoeffding"
    pooled = verdict["pooled"]
    assert pooled["method"] == "two_way_cluster_t" and pooled["deciding"] is False
    assert pooled["details"]["df"] == 1 and pooled["details"]["seeds"] == 2
    assert pooled["details"]["seed_means"] == pytest.approx(per_seed_estimates)
    html = (run / "report.html").read_text()
    assert 'id="per-seed"' in html and 'id="pooled-text"' in html
    facts = json.loads((run / "report.json").read_text())
    assert [g["seed"] for g in facts["flipped"]] == [7, 8]
    assert facts["flipped"][1]["treatment"] == "treat.seed8"


class _FakeTracker(types.ModuleType):
    """A stand-in for wandb/trackio that records the module-level calls the mirror makes."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: list[tuple[str, Any]] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append(("init", kwargs))

    def log(self, data: dict[str, float], step: int) -> None:
        self.calls.append(("log", (data, step)))

    def finish(self) -> None:
        self.calls.append(("finish", None))


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_tracker_mirrors_every_metrics_row(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeTracker(name)
    monkeypatch.setitem(sys.modules, name, fake)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-123")
    plan = write_fake_plan(tmp_path / "plan.json")
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory(), tracker=name)
    inits = [kw for call, kw in fake.calls if call == "init"]
    # one tracker run per arm: treat (pilot), base, then treat again (continuing after the pilot)
    assert [kw["name"] for kw in inits] == ["run/treat", "run/base", "run/treat"]
    assert all(kw["group"] == "run" and "environment" not in kw["config"] for kw in inits)
    assert [c for c, _ in fake.calls].count("finish") == len(inits)
    logged: dict[str, list[tuple[int, dict[str, float]]]] = {}
    current = None
    for call, payload in fake.calls:
        if call == "init":
            current = payload["config"]["unit"]
        elif call == "log":
            logged.setdefault(current, []).append((payload[1], payload[0]))
    for arm in ("base", "treat"):
        rows = _jsonl(tmp_path / "run" / "arms" / arm / "metrics.jsonl")
        assert [s for s, _ in logged[arm]] == [r["step"] for r in rows] == [0, 1, 2, 3]
        assert [d["loss/value"] for _, d in logged[arm]] == [r["loss/value"] for r in rows]
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".log", ".html"):
            assert "wandb-secret-123" not in f.read_text(), f


def test_missing_tracker_package_is_a_clear_error_before_any_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` raises ImportError
    plan = write_fake_plan(tmp_path / "plan.json")
    with pytest.raises(RunError, match=r"--tracker trackio: the trackio package is not installed"):
        run_plan(
            plan, out=tmp_path / "run", quiet=True, components_factory=factory(), tracker="trackio"
        )
    assert not (tmp_path / "run").exists()
    with pytest.raises(RunError, match=r"--tracker 'mlflow': expected one of wandb, trackio"):
        run_plan(
            plan, out=tmp_path / "run", quiet=True, components_factory=factory(), tracker="mlflow"
        )

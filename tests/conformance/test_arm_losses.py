"""The trained loss IS the checked loss: one resolved value, one constructor, one set of objects.

`plan` resolves each arm's loss once at load time (`Plan.loss(arm)`); `arm_losses(plan)` builds
the `LossFn`s; the runner's preflight and its arms both take theirs from `DefaultComponents.losses`.
Mutating the resolved value must therefore change what the preflight checks AND what the arm
trains. A path that re-reads the plan file or re-resolves the plan's loss text would still see
the original value, and this test would fail.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from losslab.backends import DEFAULT_BACKEND
from losslab.checks import PhaseResult
from losslab.engine import build_datum
from losslab.runner.components import DefaultComponents
from losslab.runner.phases import preflight
from losslab.runner.trainer import arm_config

PLAN = Path(__file__).resolve().parents[2] / "examples" / "arithmetic_dppo_vs_grpo_local.json"

SAMPLER_LP = -1.0
DRIFT = 0.2
"""|p - p_sampler| of every completion token below: between the plan's DPPO threshold 0.15
(reference_revision clip_ratio=0.15) and the mutated 0.3."""


def _components(mutated_low: float | None) -> DefaultComponents:
    comp = DefaultComponents(PLAN, DEFAULT_BACKEND)
    if mutated_low is not None:
        resolved = comp.plan.loss("treatment")
        comp.plan.set_loss("treatment", resolved.with_params(low=mutated_low, high=mutated_low))
    return comp


def _run_preflight(comp: DefaultComponents) -> PhaseResult:
    """The run's preflight phase as the runner calls it (it reads only `ctx.comp`)."""
    return preflight.run(SimpleNamespace(comp=comp, log=lambda line: None))


def _trained_mask_fraction(comp: DefaultComponents) -> float:
    """The treatment arm's training loss on datums whose every token drifted by DRIFT, A = +1."""
    arm = comp.plan.arm("treatment").name
    config = arm_config(comp.plan, comp.losses, comp.schedule, arm)
    datums = [build_datum([1, 2], [3, 4, 5], [SAMPLER_LP] * 3, 1.0)]
    # build_datum's layout: 1 shifted prompt position (masked), then the 3 completion tokens
    drifted = math.log(math.exp(SAMPLER_LP) + DRIFT)
    logprobs = [torch.tensor([0.0, drifted, drifted, drifted]).requires_grad_(True)]
    _, metrics = config.loss_fn(datums, logprobs)
    return float(metrics["loss/clip_fraction"])


def test_trained_loss_is_the_checked_loss() -> None:
    plain, mutated = _components(None), _components(0.3)
    arm = plain.plan.arm("treatment").name

    # training: the arm's loss object is the one built from the resolved value
    assert (
        arm_config(plain.plan, plain.losses, plain.schedule, arm).loss_fn.loss is plain.losses[arm]
    )
    assert mutated.losses[arm].params["low"] == 0.3
    assert mutated.losses[arm].provenance["low"] == "plan"  # with_params marks its values
    # with threshold 0.15 the 0.2 drift masks every completion token; with 0.3 none
    assert _trained_mask_fraction(plain) == 1.0
    assert _trained_mask_fraction(mutated) == 0.0

    # preflight: checks the same objects; the mutated loss no longer matches the pinned reference
    # (Stable-RL dppo_binary_tv with clip_ratio=0.15), so its reference checks fail
    checked = _run_preflight(plain)
    assert checked.passed is True
    report = _run_preflight(mutated)
    entry = report.artifact["paths"][0]
    assert "low=0.3" in entry["implementation"]["treatment"]["loss"]
    assert report.passed is False
    assert report.first_failure is not None and "reference" in report.first_failure.name
    assert not entry["checks"]["reference_gradient"]["passed"]
    assert entry["checks"]["baseline_gradient"]["passed"]  # the baseline arm was not touched


def test_resolved_loss_carries_provenance() -> None:
    comp = _components(None)
    treatment = comp.losses[comp.plan.arm("treatment").name]
    baseline = comp.losses[comp.plan.arm("baseline").name]
    assert treatment.provenance["low"] == "correctness_preflight reference_revision"
    assert treatment.provenance["reduction"] == "default"
    # grpo_clip_eps0.2: the eps is written in the plan's loss name
    assert baseline.provenance["clip_low_threshold"] == "plan"
    assert (baseline.params["clip_low_threshold"], baseline.params["clip_high_threshold"]) == (
        0.8,
        1.2,
    )


def test_a_bad_resolved_value_is_a_run_error() -> None:
    from losslab.runner.errors import RunError

    comp = _components(None)
    comp.plan.set_loss("treatment", comp.plan.loss("treatment").with_params(low=-1.0))
    with pytest.raises(RunError, match=r"arms\['dppo_seed0'\].loss 'dppo_divergence_mask'"):
        _run_preflight(comp)


# --- the same holds for a loss named as code, in each of the three forms -----------------------

USER_FILE = PLAN.parent / "my_dppo_loss.py"
"""examples/my_dppo_loss.py: DPPO-Binary-TV in Tinker's custom-loss form (delta, cap)."""


def _git(root: Path, *args: str) -> str:
    import subprocess

    cfg = ["-c", "user.name=losslab-test", "-c", "user.email=t@example.com"]
    out = subprocess.run(
        ["git", "-C", str(root), *cfg, "-c", "commit.gpgsign=false", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _code_plan(tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The arithmetic plan with its treatment loss named as code in `form`: the example file
    next to the plan, the same file as a module on sys.path, or committed in a local git
    repository that stands in for a framework's remote (fetched into the test's cache)."""
    import json
    import shutil

    args = "(delta=0.15, cap=10.0)"
    if form == "file":
        shutil.copy(USER_FILE, tmp_path / "my_dppo_loss.py")
        loss = f"my_dppo_loss.py::dppo_loss{args}"
    elif form == "module":
        pkg = tmp_path / "userpkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        shutil.copy(USER_FILE, pkg / "my_dppo.py")
        monkeypatch.syspath_prepend(str(tmp_path))
        loss = f"userpkg.my_dppo:dppo_loss{args}"
    else:
        remote = tmp_path / "remotes" / "someone+dppo-code"
        (remote / "losses").mkdir(parents=True)
        shutil.copy(USER_FILE, remote / "losses" / "my_dppo.py")
        _git(remote.parent, "init", "-q", str(remote))
        _git(remote, "add", "-A")
        _git(remote, "commit", "-q", "-m", "dppo")
        commit = _git(remote, "rev-parse", "HEAD")
        monkeypatch.setenv("LOSSLAB_SOURCE_REMOTE", str(tmp_path / "remotes" / "{owner}+{name}"))
        loss = f"someone/dppo-code@{commit}:losses/my_dppo.py::dppo_loss{args}"
    plan = json.loads(PLAN.read_text())
    plan["arms"][1]["loss"] = loss
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("form", ["file", "module", "pinned"])
def test_trained_code_is_the_checked_code(
    tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_file = _code_plan(tmp_path, form, monkeypatch)
    plain = DefaultComponents(plan_file, DEFAULT_BACKEND)
    mutated = DefaultComponents(plan_file, DEFAULT_BACKEND)
    resolved = mutated.plan.loss("treatment")
    assert resolved.user is not None and resolved.user.kind == form
    mutated.plan.set_loss("treatment", resolved.with_params(delta=0.3))
    arm = plain.plan.arm("treatment").name

    # training: the arm calls the loaded function object itself, with the resolved keywords
    config = arm_config(plain.plan, plain.losses, plain.schedule, arm)
    assert config.loss_fn.loss is plain.losses[arm]
    assert plain.losses[arm].signature == "tinker" and plain.losses[arm].params["delta"] == 0.15
    assert mutated.losses[arm].params["delta"] == 0.3
    datums = [build_datum([1, 2], [3, 4, 5], [SAMPLER_LP] * 3, 1.0)]
    drifted = math.log(math.exp(SAMPLER_LP) + DRIFT)

    def trained_mask_fraction(comp: DefaultComponents) -> float:
        loss_fn = arm_config(comp.plan, comp.losses, comp.schedule, arm).loss_fn
        logprobs = [torch.tensor([0.0, drifted, drifted, drifted]).requires_grad_(True)]
        _, metrics = loss_fn(datums, logprobs)
        return float(metrics["dppo/mask_fraction_nonzero_adv"])  # the code's own metric

    # delta 0.15: the 0.2 drift of every completion token (A = +1) masks all; delta 0.3: none
    assert trained_mask_fraction(plain) == 1.0
    assert trained_mask_fraction(mutated) == 0.0

    # preflight: the same objects; the code passes, the mutated code fails its reference checks
    checked = _run_preflight(plain)
    entry = checked.artifact["paths"][0]
    assert checked.passed is True, entry["checks"]
    assert entry["implementation"]["treatment"]["code"]["kind"] == form
    assert (
        entry["implementation"]["treatment"]["code"]["sha256"] == plain.losses[arm].code["sha256"]
    )
    report = _run_preflight(mutated)
    entry = report.artifact["paths"][0]
    assert "dppo_loss(delta=0.3, cap=10.0)" in entry["implementation"]["treatment"]["loss"]
    assert report.passed is False
    assert not entry["checks"]["reference_gradient"]["passed"]
    assert entry["checks"]["baseline_gradient"]["passed"]

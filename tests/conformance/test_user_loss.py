"""A plan arm's loss named as code: parsed and inspected at plan check, checked by the preflight.

The user file is `examples/my_dppo_loss.py` (DPPO-Binary-TV in the Tinker custom-loss form,
written without losslab). The reference is Stable-RL's `compute_policy_loss_with_mask` as the
plan pins it; offline and with an empty source cache (tests/conftest.py) the preflight compares
against losslab's labelled re-derivation of it (`--allow-rederivation`), the same numbers
`examples/my_dppo_plan.json` passed against the executed pinned source (docs/your-loss.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.conformance.preflight import PreflightError, run_preflight
from losslab.plan import check_plan_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_dppo_loss.py"
PLAN = ROOT / "examples" / "my_dppo_plan.json"
SPEC = "my_dppo_loss.py::dppo_loss(delta=0.15, cap=10.0)"
runner = CliRunner()


def _setup(tmp_path: Path, source: str | None = None, loss: str = SPEC) -> Path:
    """The example plan and (a copy of, or `source` as) the user file in `tmp_path`."""
    (tmp_path / "my_dppo_loss.py").write_text(
        EXAMPLE.read_text() if source is None else source, encoding="utf-8"
    )
    plan = json.loads(PLAN.read_text())
    plan["arms"][1]["loss"] = loss
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    return path


def _mutated(*edits: tuple[str, str]) -> str:
    text = EXAMPLE.read_text()
    for old, new in edits:
        assert old in text, old  # the example still holds the line the bug edits
        text = text.replace(old, new)
    return text


# --- plan check: what ast can see, without torch ----------------------------------------------


def test_the_example_plan_checks_and_resolves_to_its_file() -> None:
    result = check_plan_file(PLAN)
    assert result.ok, result.errors
    user = result.plan.loss("treatment").user  # type: ignore[union-attr]
    assert user is not None and user.kind == "file"
    assert Path(user.file) == EXAMPLE  # relative to the plan's folder, not the cwd
    assert user.signature is not None and user.signature.kind == "tinker"
    assert dict(user.kwargs) == {"delta": 0.15, "cap": 10.0}
    import hashlib

    assert user.sha256 == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()


PLAN_CHECK_ERRORS = [
    ("missing.py::dppo_loss()", None, "does not exist"),
    (SPEC, "def dppo_loss(data, logprobs_list:\n", "does not parse (line 1"),
    ("my_dppo_loss.py::dpo_loss(delta=0.15)", None, "no top-level function 'dpo_loss'"),
    (SPEC, "def dppo_loss(x, y, delta, cap):\n    return x\n", "none of the known loss signatures"),
    ("my_dppo_loss.py::dppo_loss(delta=0.15, kappa=1)", None, "unknown parameter 'kappa'"),
    (
        "my_dppo_loss.py::dppo_loss(cap=10)",
        "def dppo_loss(data, logprobs_list, *, delta, cap):\n    return 0\n",
        "parameter 'delta' has no default",
    ),
    ("no_such_pkg_xyz.mod:dppo_loss()", None, "is not importable"),
    ("sail-sg/Stable-RL@c6af1d1:verl/a.py::f()", None, "is not 40 hex digits"),
]


@pytest.mark.parametrize(("loss", "source", "message"), PLAN_CHECK_ERRORS)
def test_plan_check_refuses_code_it_can_see_is_wrong(
    tmp_path: Path, loss: str, source: str | None, message: str
) -> None:
    plan = _setup(tmp_path, source, loss)
    result = check_plan_file(plan)
    errors = [e for e in result.errors if e.path == "arms[1].loss"]
    assert errors and message in errors[0].message, result.errors
    if "no top-level" in message or "signature" in message:  # names the file and the function
        assert str(tmp_path / "my_dppo_loss.py") in errors[0].message
    res = runner.invoke(app, ["plan", "check", str(plan)])
    assert res.exit_code == 1 and "Traceback" not in res.output


def test_plan_check_with_code_imports_no_torch(tmp_path: Path) -> None:
    plan = _setup(tmp_path)
    code = (
        "import sys\nfrom losslab.plan import check_plan_file\n"
        f"r = check_plan_file({str(plan)!r})\nassert r.ok, r.errors\n"
        "assert 'torch' not in sys.modules, 'plan check imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_gate_metric_the_code_never_names_is_refused(tmp_path: Path) -> None:
    source = _mutated(('"dppo/mask_fraction_nonzero_adv"', '"masked"'))
    result = check_plan_file(_setup(tmp_path, source))
    assert any(
        "dppo/mask_fraction_nonzero_adv" in e.message and "never names" in e.message
        for e in result.errors
    ), result.errors


# --- the preflight: the user file against the pinned reference ---------------------------------


def _preflight(plan: Path) -> dict:
    return run_preflight(plan, offline=True, allow_rederivation=True)


def test_the_user_file_passes_the_preflight(tmp_path: Path) -> None:
    report = _preflight(_setup(tmp_path))
    entry = report["paths"][0]
    assert report["passed"], entry["checks"]
    code = entry["implementation"]["treatment"]["code"]
    assert code["file"] == str(tmp_path / "my_dppo_loss.py") and code["signature"] == "tinker"
    assert entry["stress"]["passed"]


BUGS = {
    # no cap on the IS weight: only the stress fixture (r > c) can see it
    "no_cap": (
        [("weight = torch.clamp(ratio, max=cap)", "weight = ratio")],
        "clip_ratio_c = inf",
    ),
    # masks the tokens moving against the advantage instead of with it
    "mask_direction_flipped": (
        [
            (
                "torch.where(adv > 0, diff > delta, diff < -delta)",
                "torch.where(adv > 0, diff < -delta, diff > delta)",
            )
        ],
        None,  # no single convention change of the reference does this
    ),
    "token_mean_instead_of_sum": (
        [
            (
                "    return total, metrics",
                "    n = sum(float((d.loss_fn_inputs['mask'].to_torch() > 0).sum()) for d in data)"
                "\n    return total / n, metrics",
            )
        ],
        "reduction = token-mean",
    ),
    "threshold_0.2_on_one_side": ([("diff > delta", "diff > 0.2")], "high = 0.2"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_deliberate_bug_fails_the_preflight_and_is_named(tmp_path: Path, bug: str) -> None:
    edits, cause = BUGS[bug]
    plan = _setup(tmp_path, _mutated(*edits))
    report = _preflight(plan)
    entry = report["paths"][0]
    assert report["passed"] is False
    assert entry["checks"]["baseline_gradient"]["passed"]  # the baseline arm is not the code
    stress = entry["stress"]
    summaries = [c["summary"] for c in entry["classification"].values()]
    summaries += [stress["classification"]["summary"]] if "classification" in stress else []
    if cause is None:
        assert all("no single convention change" in s for s in summaries), summaries
    else:
        assert summaries and all(cause in s for s in summaries), summaries
    res = runner.invoke(app, ["preflight", str(plan), "--offline", "--allow-rederivation"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and "preflight FAILED" in res.output


# --- load time: what only importing and calling can show ---------------------------------------

LOAD_ERRORS = [
    (
        "import no_such_module_xyz\n\ndef dppo_loss(data, logprobs_list, *, delta=0.15, cap=10.0):"
        "\n    return 0, {'dppo/mask_fraction_nonzero_adv': 0}\n",
        "importing the file failed (ModuleNotFoundError",
    ),
    (
        "def dppo_loss(data, logprobs_list, *, delta=0.15, cap=10.0):\n"
        "    return 0.0, {'dppo/mask_fraction_nonzero_adv': 0.0}\n",
        "expected a differentiable 0-d loss tensor",
    ),
    (
        "import torch\n\ndef dppo_loss(data, logprobs_list, *, delta=0.15, cap=10.0):\n"
        "    return torch.ones((), requires_grad=True), {'dppo/mask_fraction_nonzero_adv': 0}\n",
        "no gradient path to the log-probs",
    ),
]


@pytest.mark.parametrize(("source", "message"), LOAD_ERRORS)
def test_code_that_cannot_be_used_is_exit_2_naming_file_and_function(
    tmp_path: Path, source: str, message: str
) -> None:
    plan = _setup(tmp_path, source)
    assert check_plan_file(plan).ok  # ast cannot see these
    with pytest.raises(PreflightError, match="dppo_loss") as err:
        _preflight(plan)
    assert message in str(err.value) and str(tmp_path / "my_dppo_loss.py") in str(err.value)
    res = runner.invoke(app, ["preflight", str(plan), "--offline", "--allow-rederivation"])
    assert res.exit_code == 2 and "Traceback" not in res.output and message in res.output
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", str(plan), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not out.exists()  # refused before any run directory was made


def test_a_module_and_a_pinned_function_resolve_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "mylosses"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('plan check must not import me')\n")
    shutil.copy(EXAMPLE, pkg / "dppo.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = check_plan_file(_setup(tmp_path, loss="mylosses.dppo:dppo_loss(delta=0.15)"))
    assert result.ok, result.errors
    user = result.plan.loss("treatment").user  # type: ignore[union-attr]
    assert user.kind == "module" and Path(user.file) == pkg / "dppo.py"
    assert user.signature.kind == "tinker"  # read with ast, the package never imported


# --- a framework's pinned function: a verl-style policy loss as the GRPO arm -------------------

VERL_STYLE_TF = """
import torch


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()
"""

VERL_STYLE_CORE = """
from typing import Optional

import torch

from verl.trainer.config import AlgoConfig
import verl.utils.torch_functional as verl_F


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None):
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / batch_num_tokens * dp_size
    raise ValueError(loss_agg_mode)


def compute_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
    config: Optional[AlgoConfig] = None, rollout_is_weights=None,
):
    assert not isinstance(config, AlgoConfig)
    clip_ratio = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg = torch.maximum(losses1, losses2)
    loss = agg_loss(pg, response_mask, loss_agg_mode, **config.global_batch_info)
    frac = verl_F.masked_mean(torch.gt(losses2, losses1).float(), response_mask)
    return loss, {"actor/pg_clipfrac": frac.detach().item()}
"""
"""A verl-style PPO clip policy loss written for this test (verl's layout and names, the
`config` it reads, an `isinstance` assert on a config class that is not in the repository, a
helper imported from another file), not verl's code; verl's own `compute_policy_loss_vanilla`
at its pinned commit is run in docs/your-loss.md."""


@pytest.fixture
def verl_style_repo(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "verl-checkout"
    for rel, text in {
        "verl/__init__.py": "",
        "verl/utils/__init__.py": "",
        "verl/utils/torch_functional.py": VERL_STYLE_TF,
        "verl/trainer/__init__.py": "",
        "verl/trainer/ppo/__init__.py": "",
        "verl/trainer/ppo/core_algos.py": VERL_STYLE_CORE,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text.lstrip("\n"))
    cfg = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(root), *cfg, "commit", "-q", "-m", "v"], check=True)
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return root, commit


def _verl_plan(tmp_path: Path, commit: str, args: str, clip_gate: bool = False) -> Path:
    """The example plan with the verl-style function as its GRPO arm; the gate's check on the
    baseline's `loss/clip_fraction` (a key verl's function does not log) only if `clip_gate`."""
    plan = json.loads(PLAN.read_text())
    if not clip_gate:
        checks = plan["activation_gate"]["checks"]
        plan["activation_gate"]["checks"] = [
            c for c in checks if c["metric"] != "grpo_clip_fraction"
        ]
    plan["arms"][0]["loss"] = (
        f"verl-project/verl@{commit}:verl/trainer/ppo/core_algos.py::"
        f"compute_policy_loss_vanilla({args})"
    )
    plan["arms"][1]["loss"] = "dppo_divergence_mask"
    path = tmp_path / "verl_plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_a_pinned_verl_policy_loss_is_a_grpo_arm(
    tmp_path: Path, verl_style_repo: tuple[Path, str]
) -> None:
    root, commit = verl_style_repo
    plan = _verl_plan(tmp_path, commit, "clip_ratio=0.2")
    assert check_plan_file(plan).ok  # the text only: the source is fetched when built
    sources = {"verl-project/verl": root}  # the --source override, as for references
    report = run_preflight(plan, sources=sources, offline=True, allow_rederivation=True)
    entry = report["paths"][0]
    # PPO clip 0.8/1.2 summed over tokens (token-mean with batch_num_tokens = 1) is Tinker's
    # ppo, the baseline reference (Spindle's, re-derived): value and gradient agree
    assert (
        entry["checks"]["baseline_loss"]["passed"]
        and entry["checks"]["baseline_gradient"]["passed"]
    ), entry["errors"]
    code = entry["implementation"]["baseline"]["code"]
    assert code["kind"] == "pinned" and code["commit"] == commit and code["signature"] == "verl"
    assert code["extracted"].keys() == {
        "verl/utils/torch_functional.py",
        "verl/trainer/ppo/core_algos.py",
    }

    # the clip fraction the verl function reports is what the arm logs when it trains
    from losslab.conformance.arm_losses import arm_losses
    from losslab.losses.data import TokenData
    from losslab.plan import load_plan

    loss = arm_losses(load_plan(plan), sources=sources)["grpo_seed0"]
    import torch

    lp = torch.tensor([-0.1, -3.0], requires_grad=True)  # r = e^0.9 (clipped), e^-2 (clipped)
    batch = TokenData([lp], [torch.tensor([-1.0, -1.0])], [torch.ones(2)], [torch.ones(2)])
    out = loss(batch)
    assert out.metrics == {"actor/pg_clipfrac": 0.5}  # A > 0: only r = e^0.9 > 1.2 is clipped
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert grad.tolist() == pytest.approx([0.0, -float(torch.exp(torch.tensor(-2.0)))])


def test_an_unknown_verl_config_field_is_refused_when_built(
    tmp_path: Path, verl_style_repo: tuple[Path, str]
) -> None:
    root, commit = verl_style_repo
    plan = _verl_plan(tmp_path, commit, "clip_ratio=0.2, clip_ratio_x=1")
    with pytest.raises(PreflightError, match="unknown parameter 'clip_ratio_x'") as err:
        run_preflight(plan, sources={"verl-project/verl": root}, offline=True)
    assert "clip_ratio, clip_ratio_low, clip_ratio_high, global_batch_info" in str(err.value)


def test_provenance_records_the_git_commit_and_dirty_flag(tmp_path: Path) -> None:
    plan = _setup(tmp_path)
    assert check_plan_file(plan).plan.loss("treatment").user.git is None  # type: ignore[union-attr]
    cfg = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "my_dppo_loss.py"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), *cfg, "commit", "-q", "-m", "loss"], check=True)
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    user = check_plan_file(plan).plan.loss("treatment").user  # type: ignore[union-attr]
    assert user.git == {"commit": head, "dirty": False, "root": str(tmp_path.resolve())}
    assert f"(git {head[:12]})" in user.provenance()["summary"]
    with (tmp_path / "my_dppo_loss.py").open("a") as fh:
        fh.write("# an edit not committed\n")
    user = check_plan_file(plan).plan.loss("treatment").user  # type: ignore[union-attr]
    assert user.git["dirty"] is True and user.provenance()["summary"].endswith(", dirty)")


def test_a_gate_check_the_pinned_code_cannot_feed_is_refused_when_built(
    tmp_path: Path, verl_style_repo: tuple[Path, str]
) -> None:
    root, commit = verl_style_repo
    plan = _verl_plan(tmp_path, commit, "clip_ratio=0.2", clip_gate=True)
    assert check_plan_file(plan).ok  # the pinned source is not had at plan check
    with pytest.raises(
        PreflightError, match="'grpo_clip_fraction' reads 'loss/clip_fraction_nonzero_adv'"
    ):
        run_preflight(plan, sources={"verl-project/verl": root}, offline=True)


LOSSLAB_FORM = """
from losslab.losses import get_loss

# losslab's DPPO configured as Stable-RL's compute_policy_loss_with_mask (the plan's reference)
_DPPO = get_loss(
    "dppo_binary_tv", low=0.15, high=0.15, clip_ratio_c=10.0, log_ratio_guard="upper",
    zero_adv="negative", surrogate="logprob",
)


def my_loss(batch, scale=1.0):
    out = _DPPO(batch)
    return out.loss * scale, {"dppo/mask_fraction_nonzero_adv": out.metrics["dppo/mask_fraction_nonzero_adv"]}
"""

VERL_FORM_FILE = VERL_STYLE_CORE.replace(
    "from verl.trainer.config import AlgoConfig\nimport verl.utils.torch_functional as verl_F\n",
    "class AlgoConfig:\n    pass\n\n\nclass verl_F:\n    masked_mean = staticmethod("
    "lambda values, mask: (values * mask).sum() / mask.sum())\n",
)


@pytest.mark.parametrize(
    ("role", "source", "spec", "signature"),
    [
        (1, LOSSLAB_FORM, "my_loss(scale=1.0)", "losslab"),
        (0, VERL_FORM_FILE, "compute_policy_loss_vanilla(clip_ratio=0.2)", "verl"),
    ],
)
def test_each_signature_is_detected_in_a_file_and_checked(
    tmp_path: Path, role: int, source: str, spec: str, signature: str
) -> None:
    """losslab's own form as the DPPO arm, a verl policy loss as the GRPO arm, both as files."""
    assert "import verl" not in VERL_FORM_FILE  # self-contained: its helpers are inline
    (tmp_path / "code.py").write_text(source.lstrip("\n"))
    plan = json.loads(PLAN.read_text())
    plan["arms"][role]["loss"] = f"code.py::{spec}"
    if role == 0:  # verl's function logs actor/pg_clipfrac, not the gate's loss/clip_fraction
        checks = plan["activation_gate"]["checks"]
        plan["activation_gate"]["checks"] = [
            c for c in checks if c["metric"] != "grpo_clip_fraction"
        ]
        plan["arms"][1]["loss"] = "dppo_divergence_mask"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = check_plan_file(path)
    assert result.ok, result.errors
    arm = result.plan.arms[role].name  # type: ignore[union-attr]
    assert result.plan.loss(arm).user.signature.kind == signature  # type: ignore[union-attr]
    report = _preflight(path)
    assert report["passed"], report["paths"][0]["errors"]
    side = "treatment" if role == 1 else "baseline"
    assert report["paths"][0]["implementation"][side]["code"]["signature"] == signature


def test_run_source_reads_the_pinned_loss_from_the_checkout(
    tmp_path: Path, verl_style_repo: tuple[Path, str]
) -> None:
    """`losslab run --source owner/repo=PATH` reaches the arms' losses and the run's preflight
    (tests have no fetchable remote, so without it the pinned function could not be had)."""
    from types import SimpleNamespace

    from losslab.runner.components import DefaultComponents
    from losslab.runner.errors import RunError
    from losslab.runner.phases import preflight

    root, commit = verl_style_repo
    plan = _verl_plan(tmp_path, commit, "clip_ratio=0.2")
    with pytest.raises(RunError, match="could not fetch commit"):
        _ = DefaultComponents(plan, "local").losses
    comp = DefaultComponents(plan, "local", sources={"verl-project/verl": root})
    assert comp.losses["grpo_seed0"].code["obtained"] == f"checkout {root}"
    logged: list[str] = []
    result = preflight.run(SimpleNamespace(comp=comp, log=logged.append))
    # the plan's references were not given a checkout: the phase says so on the console
    assert logged and all("pinned source NOT executed" in line for line in logged)
    code = result.artifact["paths"][0]["implementation"]["baseline"]["code"]
    assert code["commit"] == commit and code["obtained"] == f"checkout {root}"
    res = runner.invoke(
        app, ["run", str(plan), "--source", "not-a-pair", "--out", str(tmp_path / "r")]
    )
    assert res.exit_code == 2 and not (tmp_path / "r").exists()

"""The atlas's adapters refuse bad revisions with a message naming the argument, and resolve
each configuration to the loss family its function and arguments implement."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.atlas import atlas_fixtures, decode
from losslab.conformance.fixtures import generate_fixture
from losslab.conformance.frameworks import resolve_reference, trl
from losslab.conformance.frameworks.openrlhf import COMMIT as ORLHF
from losslab.conformance.frameworks.skyrl_registry import COMMIT as SKY
from losslab.conformance.frameworks.tinker import SDK_COMMIT, SDK_PATH
from losslab.conformance.frameworks.verl_registry import COMMIT as VERL
from losslab.plan import RevisionError, parse_revision

V = f"verl-project/verl@{VERL}:verl/trainer/ppo/core_algos.py::"
S = f"NovaSky-AI/SkyRL@{SKY}:skyrl/backends/skyrl_train/utils/ppo_utils.py::"
O = f"OpenRLHF/OpenRLHF@{ORLHF}:openrlhf/models/loss.py::PolicyLoss"
GOLDEN = Path(__file__).with_name("data") / "atlas_golden.json"
T = f"thinking-machines-lab/tinker@{SDK_COMMIT}:{SDK_PATH}::forward_backward"


def _family(text: str) -> str:
    return resolve_reference(parse_revision(text)).loss_family


@pytest.mark.parametrize(
    ("text", "family"),
    [
        (V + "compute_policy_loss_vanilla()", "dual_clip"),
        (V + "compute_policy_loss_vanilla(clip_ratio_high=0.28, global_batch_info={})", "dapo"),
        (V + "compute_policy_loss_vanilla(loss_agg_mode='seq-mean-token-sum-norm')", "dr_grpo"),
        (V + "compute_policy_loss_geo_mean()", "gmpo"),
        (S + "ppo_policy_loss()", "ppo_clip"),
        (S + "ppo_policy_loss(policy_loss_type='dual_clip')", "dual_clip"),
        (O + "(dual_clip=3.0)", "dual_clip"),
        (O + "(policy_loss_type='gspo')", "gspo"),
        (
            O + "(enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 5.0], "
            "vllm_is_correction_type='icepop')",
            "icepop",
        ),
        (T + "(loss_fn='cispo')", "cispo"),
    ],
)
def test_each_configuration_has_its_family(text: str, family: str) -> None:
    assert _family(text) == family


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (V + "compute_policy_loss_dro()", "dro_beta = None; verl's DRO needs a positive"),
        (V + "compute_policy_loss_gspo(clip_ratio_low='x')", "clip_ratio_low = 'x'; expected"),
        (V + "compute_policy_loss_cispo(eps=1)", r"unknown arguments \['eps'\]"),
        (S + "gspo_policy_loss(policy_loss_type='dual_clip')", "only ppo_policy_loss takes it"),
        (S + "compute_policy_loss_cispo(cispo_anchor='x')", "cispo_anchor = 'x'; expected"),
        (O + "(enable_vllm_is_correction=True)", "vllm_is_truncated_threshold = None"),
        (O + "(policy_loss_type='grpo')", "policy_loss_type = 'grpo'; expected"),
        (T + "(loss_fn='gspo')", "loss_fn = 'gspo'; expected one of"),
        (T + "(loss_fn='ppo', beta=1)", r"unknown loss_fn_config keys \['beta'\]"),
    ],
)
def test_bad_revisions_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(RevisionError, match=message):
        resolve_reference(parse_revision(text))


# ---------------------------------------------------------------- TRL 1.16.0 (trl.py) ---

TRL_REV = f"{trl.REPO}@{trl.PIN}:{trl.PATH}::{trl.FUNCTION}"
# `make bench` builds .venv-bench with trl==1.16.0 (docs/benchmarks.md); LOSSLAB_TRL_ENV
# names another environment holding it
TRL_ENV = Path(os.environ.get("LOSSLAB_TRL_ENV", Path(__file__).parents[2] / ".venv-bench"))


@pytest.mark.parametrize(
    ("args", "family"),
    [
        ("loss_type='grpo'", "ppo_clip"),
        ("loss_type='bnpo'", "ppo_clip"),
        ("loss_type='dr_grpo'", "dr_grpo"),
        ("loss_type='dapo'", "dapo"),
        ("loss_type='cispo', epsilon_high=5.0", "cispo"),
        ("loss_type='grpo', importance_sampling_level='sequence'", "gspo"),
        ("loss_type='luspo', importance_sampling_level='sequence'", "gspo"),
    ],
)
def test_trl_loss_types_have_their_family(args: str, family: str) -> None:
    assert _family(f"{TRL_REV}({args})") == family


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("loss_type='sapo'", "loss_type = 'sapo'; the adapter runs"),
        ("epsilon=-0.2", "epsilon = -0.2; expected a positive number"),
        ("importance_sampling_level='seq'", "importance_sampling_level = 'seq'; expected"),
        ("beta=0.04", r"unknown arguments \['beta'\]"),
    ],
)
def test_trl_bad_revisions_are_refused_by_name(args: str, message: str) -> None:
    with pytest.raises(RevisionError, match=message):
        resolve_reference(parse_revision(f"{TRL_REV}({args})"))


def test_trl_cispo_cap_is_absolute_and_dr_grpo_divides_by_every_row() -> None:
    fx = generate_fixture(atlas_fixtures()["stress"])
    cispo = resolve_reference(parse_revision(f"{TRL_REV}(loss_type='cispo', epsilon_high=5.0)"))
    assert trl.losslab_config(cispo, fx).params["epsilon_meaning"] == "absolute_cap"
    dr = resolve_reference(parse_revision(f"{TRL_REV}(loss_type='dr_grpo')"))
    params = trl.losslab_config(dr, fx).params
    # sum / (B * max_completion_length): B = all 16 rows (one all-masked), C = 512 (GRPOConfig)
    assert (params["norm_constant"], params["max_completion_length"]) == (16.0, 512.0)


def _trl_env_problem() -> str | None:
    try:
        python = trl.python_of(TRL_ENV)
    except RevisionError as err:
        return str(err)
    probe = subprocess.run(
        [str(python), "-c", "import trl; print(trl.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.stdout.strip() != trl.VERSION:
        return f"{python} has no trl=={trl.VERSION} ({probe.stdout.strip() or probe.stderr[-200:]})"
    return None


def test_trl_golden_rows_are_reproduced_by_the_installed_release() -> None:
    """TRL's own `_compute_loss`, run again from trl 1.16.0, gives the golden's reference
    numbers of the CISPO row on set A (the golden was written by the same adapter)."""
    problem = _trl_env_problem()
    if problem:
        pytest.skip(f"trl {trl.VERSION} environment not available: {problem}")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    row = next(r for r in golden["rows"] if r["name"] == "trl_cispo")
    ref = resolve_reference(parse_revision(row["revision"]))
    got = trl.run_installed(ref, TRL_ENV, generate_fixture(atlas_fixtures()["set_a"]))
    assert got.source["file_sha256"] == trl.FILE_SHA256
    assert got.loss == pytest.approx(row["reference"]["set_a"]["loss"], rel=1e-6)
    want_D = [decode(g) for g in row["reference"]["set_a"]["grad_D"]]
    for g, w in zip(got.grad_D, want_D, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)

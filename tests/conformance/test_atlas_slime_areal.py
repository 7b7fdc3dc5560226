"""The slime and AReaL adapters: each configuration resolves to its loss family, bad revisions
are refused by name, and (with the local mirrors) their pinned source runs and matches losslab's
configuration the way the atlas says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.atlas import atlas_fixtures, atlas_revisions, run_row
from losslab.conformance.fixtures import generate_fixture
from losslab.conformance.frameworks import resolve_reference
from losslab.conformance.frameworks.areal import COMMIT as AREAL
from losslab.conformance.frameworks.slime import COMMIT as SLIME
from losslab.plan import RevisionError, parse_revision

SP = f"THUDM/slime@{SLIME}:slime/utils/ppo_utils.py::"
SL = f"THUDM/slime@{SLIME}:slime/backends/megatron_utils/loss.py::"
A = f"inclusionAI/AReaL@{AREAL}:areal/utils/functional/functional.py::"
SLIME_MIRROR = Path("/work/.mirror/THUDM+slime/repo")
AREAL_MIRROR = Path("/work/.mirror/inclusionAI+AReaL/repo")


def _resolved(text: str):  # noqa: ANN202 - a ResolvedReference
    return resolve_reference(parse_revision(text))


@pytest.mark.parametrize(
    ("text", "family"),
    [
        (SP + "compute_policy_loss()", "ppo_clip"),
        (SP + "compute_policy_loss(eps_clip_c=3.0)", "dual_clip"),
        (SP + "compute_gspo_kl()", "gspo"),
        (SP + "compute_cispo_loss()", "cispo"),
        (SL + "vanilla_tis_function()", "rollout_correction"),
        (SL + "icepop_function()", "icepop"),
        (A + "ppo_actor_loss_fn()", "ppo_clip"),
        (A + "ppo_actor_loss_fn(c_clip=3.0)", "dual_clip"),
        (A + "ppo_actor_loss_fn(importance_sampling_level='sequence')", "gspo"),
        (A + "ppo_actor_loss_fn(rejection_sampling={'action': 'clamp'})", "rollout_correction"),
        (A + "ppo_actor_loss_fn(rejection_sampling={'lower': 0.5})", "icepop"),
        (A + "sapo_loss_fn()", "sapo"),
    ],
)
def test_each_configuration_has_its_family(text: str, family: str) -> None:
    assert _resolved(text).loss_family == family


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SP + "compute_policy_loss(eps_clip_c=0.5)", "eps_clip_c = 0.5; expected > 1"),
        (SP + "compute_cispo_loss(eps_clip_c=3.0)", r"unknown arguments \['eps_clip_c'\]"),
        (SL + "vanilla_tis_function(loss='gspo')", "loss = 'gspo'; expected 'ppo' or 'cispo'"),
        (SP + "compute_policy_loss(eps_clip='x')", "eps_clip = 'x'; expected a number"),
        (A + "ppo_actor_loss_fn(c_clip=1.0)", "c_clip = 1.0; expected > 1"),
        (A + "ppo_actor_loss_fn(rejection_sampling={'mode': 'x'})", r"has \['mode'\]"),
        (
            A + "ppo_actor_loss_fn(rejection_sampling={'action': 'drop'})",
            "rejection_sampling.action = 'drop'; expected one of",
        ),
        (A + "sapo_loss_fn(tau_pos=0)", "tau_pos = 0.0; expected > 0"),
        (A + "ppo_actor_loss_fn(importance_sampling_level='seq')", "expected 'token' or"),
    ],
)
def test_bad_revisions_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(RevisionError, match=message):
        _resolved(text)


def test_slime_cispo_maps_to_one_plus_eps() -> None:
    """slime's CISPO eps are offsets from 1 (eps_clip_high 4.0 = a cap of 5), the semantics the
    issue names; the TRL-style absolute cap would be a different loss."""
    ref = _resolved(SP + "compute_cispo_loss(eps_clip=1.0, eps_clip_high=4.0)")
    config = ref.framework.losslab_config(ref, None)
    assert config.loss == "cispo_eps"
    assert config.params["epsilon_meaning"] == "one_plus_eps"
    assert (config.params["epsilon_low"], config.params["epsilon_high"]) == (1.0, 4.0)


def test_unreproducible_configurations_say_why() -> None:
    seq = _resolved(A + "ppo_actor_loss_fn(rejection_sampling={'level': 'sequence'})")
    assert "geometric mean" in seq.framework.losslab_config(seq, None).reason
    cispo_tis = _resolved(SL + "vanilla_tis_function(loss='cispo')")
    assert "CISPO under TIS" in cispo_tis.framework.losslab_config(cispo_tis, None).reason


def _row(name: str) -> dict:
    (family, _, text) = next(r for r in atlas_revisions() if r[1] == name)
    fixtures = {k: generate_fixture(v) for k, v in atlas_fixtures().items()}
    sources = {"THUDM/slime": SLIME_MIRROR, "inclusionAI/AReaL": AREAL_MIRROR}
    return run_row(family, name, text, fixtures, sources, fetch=False, offline=True)


@pytest.mark.skipif(not SLIME_MIRROR.exists(), reason=f"no slime checkout at {SLIME_MIRROR}")
def test_slime_cispo_from_source_differs_only_by_its_batch_size() -> None:
    """Set A: every sample has loss tokens, so slime's / B and losslab's / (samples with a loss
    token) agree: 0 differing tokens. The stress fixture has one of 16 samples without a loss
    token, so slime's value and gradient are losslab's times 15/16 exactly, the named reason."""
    row = _row("slime_cispo")
    assert row["executed"]
    assert row["cells"]["set_a"]["tokens_differing"] == 0
    assert row["cells"]["set_a"]["value_agrees"]
    stress = row["cells"]["stress"]
    assert stress["reference_loss"] / stress["losslab_loss"] == pytest.approx(15 / 16, rel=1e-5)
    assert row["reason"].startswith("batch size: slime divides")


@pytest.mark.skipif(not SLIME_MIRROR.exists(), reason=f"no slime checkout at {SLIME_MIRROR}")
def test_slime_tis_runs_its_loss_py_with_ppo_utils_imported() -> None:
    """vanilla_tis_function lives in loss.py and composes compute_policy_loss imported from
    ppo_utils: the extractor must execute ppo_utils first (it failed with a KeyError before)."""
    row = _row("slime_tis")
    assert row["executed"]
    assert row["cells"]["set_a"]["tokens_differing"] == 0
    assert np.isinf(row["cells"]["stress"]["reference_loss"])  # bare exp at log r = 91


@pytest.mark.skipif(not AREAL_MIRROR.exists(), reason=f"no AReaL checkout at {AREAL_MIRROR}")
def test_areal_gspo_from_source_equals_losslab_on_both_fixtures() -> None:
    row = _row("areal_gspo")
    assert row["executed"]
    for cell in row["cells"].values():
        assert cell["tokens_differing"] == 0 and cell["value_agrees"]
    assert row["reason"] == ""

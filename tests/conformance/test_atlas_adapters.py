"""The atlas's adapters refuse bad revisions with a message naming the argument, and resolve
each configuration to the loss family its function and arguments implement."""

from __future__ import annotations

import pytest

from losslab.conformance.frameworks import resolve_reference
from losslab.conformance.frameworks.openrlhf import COMMIT as ORLHF
from losslab.conformance.frameworks.skyrl_registry import COMMIT as SKY
from losslab.conformance.frameworks.tinker import SDK_COMMIT, SDK_PATH
from losslab.conformance.frameworks.verl_registry import COMMIT as VERL
from losslab.plan import RevisionError, parse_revision

V = f"verl-project/verl@{VERL}:verl/trainer/ppo/core_algos.py::"
S = f"NovaSky-AI/SkyRL@{SKY}:skyrl/backends/skyrl_train/utils/ppo_utils.py::"
O = f"OpenRLHF/OpenRLHF@{ORLHF}:openrlhf/models/loss.py::PolicyLoss"
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

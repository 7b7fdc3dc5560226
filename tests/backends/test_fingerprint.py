"""The dispatch fingerprint on the local backend: each arm's loss path, run once on the backend,
against the declared loss computed client-side; a backend whose built-in `ppo` uses other clip
bounds (or whose custom path hands the loss other data) is caught at the token it changes."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from losslab.backends.fingerprint import (
    PROBE_ADVANTAGES,
    PROBE_RATIOS,
    PROMPT_TARGETS,
    dispatch_phase,
    fingerprint,
)
from losslab.losses import get_loss
from losslab.losses.tinker_builtins import builtin_request

WRONG_CLIP = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}


class OtherClipBounds:
    """A backend client whose built-in `ppo` clips at 0.9 / 1.1 whatever the request says (a
    server that ignores `loss_fn_config`, or defaults differently); everything else passes."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def forward(self, data, loss_fn="cross_entropy", loss_fn_config=None):
        return self._client.forward(
            data, loss_fn, WRONG_CLIP if loss_fn == "ppo" else loss_fn_config
        )

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        config = WRONG_CLIP if loss_fn == "ppo" else loss_fn_config
        return self._client.forward_backward(data, loss_fn, config)


class MisalignedLogprobs:
    """A backend client whose custom path hands the loss each datum's log-probs shifted by one
    target (an off-by-one between `model_input` and `target_tokens`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def forward_backward_custom(self, data, loss_fn, **kw):
        def shifted(batch, logprobs_list):
            return loss_fn(batch, [torch.roll(lp, 1) for lp in logprobs_list])

        return self._client.forward_backward_custom(data, shifted, **kw)


@pytest.fixture
def client(service, tiny_llama):
    return service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()


@pytest.mark.parametrize("name", ["importance_sampling", "ppo", "cispo", "dro", "cross_entropy"])
def test_each_builtin_path_matches_its_declared_loss(client, name):
    loss = get_loss(name)
    result = fingerprint("arm", client, loss, builtin_request(name, loss.params))
    assert result.passed, result.note
    assert result.measured["loss_sum"] == pytest.approx(result.measured["declared_loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["ppo", "dppo_binary_tv", "cross_entropy"])
def test_the_custom_path_matches_its_declared_loss(client, name):
    result = fingerprint("arm", client, get_loss(name))
    assert result.passed, result.note
    assert result.measured["logprob_max_abs_diff"] == 0.0  # the same weights, the same tokens


def test_a_builtin_ppo_with_other_clip_bounds_is_caught_at_its_first_token(client):
    loss = get_loss("ppo")
    result = fingerprint("grpo", OtherClipBounds(client), loss, builtin_request("ppo", loss.params))
    assert not result.passed
    # datum 0 (A = +1): its targets from PROMPT_TARGETS take PROBE_RATIOS in order; the first
    # one a 1.1 upper bound clips but 1.2 does not is r = 1.15
    d, t = result.first_difference
    assert d == 0 and PROBE_ADVANTAGES[0] > 0
    assert PROBE_RATIOS[t - PROMPT_TARGETS] == 1.15
    assert "arm 'grpo'" in result.note and f"datum 0 token {t}" in result.note
    # at that token: the backend's -A·1.1 against the declared -A·1.15
    first = result.measured["first_token"]
    assert first["backend"] == pytest.approx(-1.1, rel=1e-5)
    assert first["declared"] == pytest.approx(-1.15, rel=1e-5)


def test_a_custom_path_with_misaligned_logprobs_is_caught(client):
    result = fingerprint("dppo", MisalignedLogprobs(client), get_loss("dppo_binary_tv"))
    assert not result.passed and result.first_difference == (0, 0)
    assert "arm 'dppo'" in result.note and "log-probs handed to the loss differ" in result.note


def test_dispatch_phase_rows_and_artifact(client):
    loss = get_loss("ppo")
    arms = {
        "grpo": (loss, builtin_request("ppo", loss.params)),
        "dppo": (get_loss("dppo_binary_tv"), None),
    }
    ok = dispatch_phase(client, arms)
    assert ok.passed and [c.name for c in ok.checks] == ["grpo.dispatch", "dppo.dispatch"]
    assert ok.artifact["arms"]["grpo"]["path"] == "builtin:ppo"
    bad = dispatch_phase(OtherClipBounds(client), arms)
    assert bad.first_failure is not None and bad.first_failure.name == "grpo.dispatch"
    assert bad.artifact["arms"]["dppo"]["passed"]  # the custom arm does not go through ppo
    assert math.isfinite(bad.artifact["arms"]["grpo"]["loss_sum"])


def test_only_losses_a_builtin_computes_can_take_the_builtin_path():
    assert builtin_request("ppo", get_loss("ppo", clip_low=0.7).params) == (
        "ppo",
        {"clip_low_threshold": 0.7, "clip_high_threshold": 1.2},
    )
    with pytest.raises(ValueError, match="'dppo_binary_tv' has no Tinker built-in"):
        builtin_request("dppo_binary_tv", get_loss("dppo_binary_tv").params)
    with pytest.raises(ValueError, match="reduction='token-mean'.*computes reduction='sum'"):
        builtin_request("ppo", get_loss("ppo", reduction="token-mean").params)
    with pytest.raises(ValueError, match="surrogate='ratio'"):
        builtin_request("ppo", get_loss("ppo", surrogate="ratio").params)

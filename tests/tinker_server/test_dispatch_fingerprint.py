"""The dispatch fingerprint (`losslab.backends.fingerprint`) against a real Tinker-API server.

On SkyRL's server (skyrl 0.4.0, conftest) the custom path hands the loss a plain forward's
log-probs and backpropagates the declared loss, and its built-in `importance_sampling` and `ppo`
return per-token `elementwise_loss` equal to Tinker's documented sums: measured max |difference|
0.0 on every path here (float32 both sides; loss:sum -3.4750 for `ppo` on the probe). A client
whose built-in `ppo` clips at 0.9 / 1.1 whatever the request says is caught at the first token
it changes, from the server's own per-token losses.
"""

from __future__ import annotations

from typing import Any

import pytest

from losslab.backends import create_service_client
from losslab.backends.fingerprint import (
    PROBE_RATIOS,
    PROMPT_TARGETS,
    dispatch_phase,
    fingerprint,
)
from losslab.losses import get_loss
from losslab.losses.tinker_builtins import builtin_request

from .conftest import START_TIMEOUT_S, TEST_KEY


@pytest.fixture(scope="module")
def probe_client(skyrl_server, sdk_shims):
    """A client of its own: the probe's gradients stay in it (it never steps)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINKER_BASE_URL", skyrl_server.base_url)
        mp.setenv("TINKER_API_KEY", TEST_KEY)
        service = create_service_client("tinker", create_timeout_s=START_TIMEOUT_S)
        yield service.create_lora_training_client(skyrl_server.base_model, rank=4, seed=0).result()


class OtherClipBounds:
    """The server's client with its built-in `ppo` asked for 0.9 / 1.1 whatever the caller's
    config says (a server or SDK that drops `loss_fn_config`, or defaults differently)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        wrong = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
        return self._client.forward_backward(
            data, loss_fn, wrong if loss_fn == "ppo" else loss_fn_config
        )


@pytest.mark.parametrize("name", ["ppo", "dppo_binary_tv", "cross_entropy"])
def test_the_custom_path_passes_on_the_real_server(tinker_env, probe_client, name):
    result = fingerprint("arm", probe_client, get_loss(name))
    assert result.passed, result.note
    assert result.measured["logprob_max_abs_diff"] <= 1e-6
    assert result.measured["loss_sum"] == pytest.approx(result.measured["declared_loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["importance_sampling", "ppo"])
def test_the_builtin_path_passes_on_the_real_server(tinker_env, probe_client, name):
    loss = get_loss(name)
    result = fingerprint("arm", probe_client, loss, builtin_request(name, loss.params))
    assert result.passed, result.note
    # the server returns per-token losses, so they (not only the sum) were compared
    assert result.measured["elementwise_max_abs_diff"] <= 1e-5


def test_other_clip_bounds_on_the_real_server_are_caught(tinker_env, probe_client):
    loss = get_loss("ppo")
    result = fingerprint(
        "grpo", OtherClipBounds(probe_client), loss, builtin_request("ppo", loss.params)
    )
    assert not result.passed
    d, t = result.first_difference
    assert d == 0 and PROBE_RATIOS[t - PROMPT_TARGETS] == 1.15  # A = +1: clipped at 1.1, not 1.2
    assert "arm 'grpo'" in result.note and "elementwise loss -1.1, declared -1.15" in result.note


def test_dispatch_phase_on_the_real_server(tinker_env, probe_client):
    ppo = get_loss("ppo")
    arms = {
        "grpo": (ppo, builtin_request("ppo", ppo.params)),
        "dppo": (get_loss("dppo_binary_tv"), None),
    }
    result = dispatch_phase(probe_client, arms)
    assert result.passed, result.failures
    assert [c.name for c in result.checks] == ["grpo.dispatch", "dppo.dispatch"]

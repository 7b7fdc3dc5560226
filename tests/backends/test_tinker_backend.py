"""Tinker backend without network: what it would send, the key handling, and a live smoke test
that runs only with TINKER_API_KEY."""

from __future__ import annotations

import os

import pytest
import torch
from tinker import types

from losslab.backends import create_service_client
from losslab.backends.tinker import (
    TinkerKeyError,
    TinkerServiceClient,
    builtin_request,
)

from .conftest import rl_batch

SECRET = "tml-test-secret-key-do-not-print"


class _Recorder:
    """Stands in for the SDK TrainingClient/ServiceClient and records every call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def record(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "create_lora_training_client":
                return _Done(_Recorder())
            if name == "get_info":
                return types.GetInfoResponse(model_id="m", model_data=types.ModelData())
            return _Done(None)

        return record


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


def _with_mask(data):
    return [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={**d.loss_fn_inputs, "mask": torch.ones(d.model_input.length)},
        )
        for d in data
    ]


def test_builtin_request_strips_client_only_keys_and_checks_config():
    data = _with_mask(rl_batch(0))
    sent, config = builtin_request(
        data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    assert all(set(d.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"} for d in sent)
    assert [d.model_input.to_ints() for d in sent] == [d.model_input.to_ints() for d in data]
    assert config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert builtin_request(data, "importance_sampling", None)[1] is None
    with pytest.raises(ValueError, match="not accepted by 'importance_sampling'"):
        builtin_request(data, "importance_sampling", {"beta": 0.1})
    ce, _ = builtin_request(data, "cross_entropy", None)
    assert all(set(d.loss_fn_inputs) == {"target_tokens"} for d in ce)


def test_training_client_sends_stripped_datums_and_configured_adam():
    svc = TinkerServiceClient(sdk_client=_Recorder())
    planned = types.AdamParams(learning_rate=2e-5, beta1=0.9, beta2=0.95, eps=1e-8)
    tc = svc.create_lora_training_client(
        "Qwen/Qwen3-4B", rank=32, seed=0, adam_params=planned
    ).result()
    sdk = tc._sdk
    data = _with_mask(rl_batch(0))
    tc.forward_backward(data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    name, args, _ = sdk.calls[-1]
    assert name == "forward_backward" and args[1] == "ppo"
    assert all("mask" not in d.loss_fn_inputs for d in args[0])

    def custom(d, lps):
        return sum(lp.sum() for lp in lps), {}

    tc.forward_backward_custom(data, custom)
    name, args, _ = sdk.calls[-1]
    assert name == "forward_backward_custom" and args[1] is custom
    assert all("mask" in d.loss_fn_inputs for d in args[0])  # the SDK keeps them client-side
    tc.optim_step()
    assert sdk.calls[-1] == ("optim_step", (planned,), {})
    cfg = tc.optimizer_config()
    assert (cfg["type"], cfg["learning_rate"], cfg["eps"]) == ("adamw", 2e-5, 1e-8)


def test_api_key_only_from_env_and_never_printed(monkeypatch):
    import tinker

    seen = {}

    class FakeSDK:
        def __init__(self, api_key=None, **kw):
            seen["api_key"] = api_key

    monkeypatch.setattr(tinker, "ServiceClient", FakeSDK)
    # no network in unit tests: the reachability probe has its own test on a closed local port
    monkeypatch.setattr("losslab.backends.tinker.probe_service", lambda url: None)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(TinkerKeyError, match="TINKER_API_KEY is not set"):
        create_service_client("tinker")
    with pytest.raises(ValueError, match="api_key is not accepted"):
        TinkerServiceClient(api_key=SECRET)
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    svc = create_service_client("tinker")
    assert seen["api_key"] == SECRET
    assert SECRET not in repr(svc) and SECRET not in str(svc)
    assert SECRET not in repr(vars(svc))


def test_unreachable_service_times_out_with_a_named_message():
    # A creation future that never completes: client creation must end instead.
    import concurrent.futures

    class NeverDone:
        def result(self, timeout=None):
            concurrent.futures.Future().result(timeout)  # raises TimeoutError after `timeout`

    class HangingSDK:
        def create_lora_training_client(self, base_model, **kw):
            return NeverDone()

    svc = TinkerServiceClient(sdk_client=HangingSDK(), create_timeout_s=0.05)
    with pytest.raises(TimeoutError, match=r"no training client within 0.05 s"):
        svc.create_lora_training_client("Qwen/Qwen3.5-2B", rank=32, seed=0).result()


def test_a_creation_call_that_blocks_is_bounded_too():
    # SDK 0.38 on a closed port blocks ~300 s inside create_lora_training_client itself
    # (connection retries) before returning any future; the timeout must cover that call.
    import threading

    release = threading.Event()

    class BlockingSDK:
        def create_lora_training_client(self, base_model, **kw):
            release.wait(30)
            raise ConnectionError("gave up")

    svc = TinkerServiceClient(sdk_client=BlockingSDK(), create_timeout_s=0.05)
    try:
        with pytest.raises(TimeoutError, match="check TINKER_BASE_URL"):
            svc.create_lora_training_client("Qwen/Qwen3.5-2B", rank=32, seed=0).result()
    finally:
        release.set()
    # an error the SDK raises in time reaches the caller as is
    svc = TinkerServiceClient(sdk_client=BlockingSDK(), create_timeout_s=5.0)
    with pytest.raises(ConnectionError, match="gave up"):
        svc.create_lora_training_client("Qwen/Qwen3.5-2B", rank=32, seed=0).result()


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="expected one of"):
        create_service_client("vllm")


@pytest.mark.network
@pytest.mark.skipif(not os.environ.get("TINKER_API_KEY"), reason="TINKER_API_KEY is not set")
def test_live_smoke_forward_on_the_service():
    svc = create_service_client("tinker")
    tc = svc.create_lora_training_client("meta-llama/Llama-3.2-1B", rank=8, seed=0).result()
    tok = tc.get_tokenizer()
    ids = tok.encode("What is 7 + 5? 12", add_special_tokens=False)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    out = tc.forward([datum], "cross_entropy").result()
    assert len(out.loss_fn_outputs[0]["logprobs"].data) == len(ids) - 1
    assert out.metrics["loss:sum"] > 0

"""`losslab.backends.tinker` against a real Tinker-API server (SkyRL's, on loopback).

What is asserted is the protocol: each SDK call losslab makes is accepted and answered in the
shape losslab reads, paths are `tinker://` paths, a restored state answers as the saved one, and
the forward log-probs of the untouched base model equal the local backend's. Server loss values
and sampled tokens are SkyRL's numerics, not Tinker's, and are never compared with Tinker.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from tinker import types

from losslab.backends import create_service_client
from losslab.backends.tinker import TinkerKeyError, TinkerServiceClient

from .conftest import TEST_KEY

REPO = Path(__file__).resolve().parents[2]
# Measured on this suite (tiny Qwen3, 3 sequences, float32 both sides): max diff 4.77e-7.
LOGPROB_ATOL = 1e-5


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:]))},
    )


def _rl_datum(tokens: list[int], prompt_len: int, advantage: float) -> types.Datum:
    n = len(tokens) - 1
    ob = prompt_len - 1
    mask = torch.zeros(n)
    mask[ob:] = 1.0
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:])),
            "logprobs": types.TensorData.from_torch(torch.full((n,), -5.5) * mask),
            "advantages": types.TensorData.from_torch(torch.full((n,), advantage) * mask),
            "mask": types.TensorData.from_torch(mask),
        },
    )


BATCH = [list(range(10, 40)), [5, 77, 200, 3, 9, 250, 100, 41], list(range(100, 112))]


def _logprobs(client, data) -> list[torch.Tensor]:
    out = client.forward(data, "cross_entropy").result()
    assert len(out.loss_fn_outputs) == len(data)
    return [o["logprobs"].to_torch().to(torch.float64) for o in out.loss_fn_outputs]


def test_client_creation_serves_the_model(tinker_env, training_client):
    service = create_service_client("tinker")
    caps = service.get_server_capabilities()
    assert tinker_env.base_model in [m.model_name for m in caps.supported_models]
    info = training_client.get_info()
    assert info.model_data.model_name == tinker_env.base_model
    assert training_client.get_tokenizer().convert_tokens_to_ids("<|im_end|>") == 258


def test_a_closed_port_is_refused_at_once_naming_the_service(tinker_env, monkeypatch):
    """The client's TCP probe refuses an unreachable URL before the SDK's retry loop starts
    (that loop took ~303 s here); a server that accepts but never answers is bounded by
    `create_timeout_s` instead (tests/backends/test_tinker_unreachable.py)."""
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("TINKER_BASE_URL", f"http://127.0.0.1:{closed}")
    with pytest.raises(ConnectionError, match=rf"127\.0\.0\.1:{closed}.*TINKER_BASE_URL"):
        service = TinkerServiceClient(create_timeout_s=3.0)
        service.create_lora_training_client(tinker_env.base_model, rank=4).result()


def test_key_comes_only_from_the_environment(tinker_env, monkeypatch, training_client):
    with pytest.raises(ValueError, match="TINKER_API_KEY"):
        TinkerServiceClient(api_key=TEST_KEY)
    service = TinkerServiceClient()
    assert TEST_KEY not in repr(service) and TEST_KEY not in repr(training_client)
    monkeypatch.delenv("TINKER_API_KEY")
    with pytest.raises(TinkerKeyError, match="TINKER_API_KEY is not set"):
        TinkerServiceClient()


def test_forward_logprobs_equal_the_local_backend(tinker_env, training_client, tmp_path):
    # A fresh LoRA adapter is the identity (B = 0) on both sides, so both score the base model.
    local = create_service_client("local", device="cpu", state_dir=tmp_path / "states")
    local_client = local.create_lora_training_client(tinker_env.base_model, rank=4, seed=0).result()
    fresh = (
        create_service_client("tinker")
        .create_lora_training_client(tinker_env.base_model, rank=4, seed=0)
        .result()
    )
    data = [_datum(t) for t in BATCH]
    server, here = _logprobs(fresh, data), _logprobs(local_client, data)
    for s, h, tokens in zip(server, here, BATCH, strict=True):
        assert s.shape == h.shape == (len(tokens) - 1,)
        assert torch.allclose(s, h, atol=LOGPROB_ATOL, rtol=0.0), float((s - h).abs().max())


def test_builtin_loss_round_trip_strips_client_only_keys(training_client):
    data = [
        _rl_datum(t, prompt_len=4, advantage=a)
        for t, a in zip(BATCH, (1.0, -0.5, 0.25), strict=True)
    ]
    out = training_client.forward_backward(data, "importance_sampling").result()
    assert len(out.loss_fn_outputs) == len(data)
    for o, d in zip(out.loss_fn_outputs, data, strict=True):
        assert o["logprobs"].to_torch().shape == (d.model_input.length,)
    assert math.isfinite(out.metrics["loss:sum"])
    step = training_client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert isinstance(step, types.OptimStepResponse)


def test_custom_loss_round_trip(training_client):
    data = [
        _rl_datum(t, prompt_len=4, advantage=a)
        for t, a in zip(BATCH, (1.0, -0.5, 0.25), strict=True)
    ]
    seen = {}

    def loss_fn(batch, logprobs_list):
        seen["n"] = len(logprobs_list)
        total = sum(
            -(lp * d.loss_fn_inputs["advantages"].to_torch()).sum()
            for d, lp in zip(batch, logprobs_list, strict=True)
        )
        return total, {"custom/value": float(total.detach())}

    out = training_client.forward_backward_custom(data, loss_fn).result()
    assert seen["n"] == len(data)
    # the SDK reports the client-side loss as loss:sum and the server's linear surrogate apart
    assert out.metrics["loss:sum"] == pytest.approx(out.metrics["custom/value"], rel=1e-6)
    assert math.isfinite(out.metrics["surrogate_loss:sum"])
    training_client.optim_step().result()  # the client's configured AdamParams


def test_sampling(training_client):
    sampler = training_client.save_weights_and_get_sampling_client()
    sampler = sampler.result() if hasattr(sampler, "result") else sampler
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3, stop=[258])
    out = sampler.sample(types.ModelInput.from_ints(BATCH[0][:6]), 3, params).result()
    assert len(out.sequences) == 3
    for seq in out.sequences:
        assert 1 <= len(seq.tokens) <= 4 and len(seq.logprobs) == len(seq.tokens)
        assert seq.stop_reason in ("length", "stop")
        assert all(0 <= t < 259 for t in seq.tokens)
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in seq.logprobs)


def test_checkpoints_are_tinker_paths_and_restore(tinker_env, training_client):
    data = [_datum(t) for t in BATCH]
    saved = training_client.save_state("protocol-state").result()
    assert saved.path.startswith("tinker://")
    before = _logprobs(training_client, data)
    sampler_path = training_client.save_weights_for_sampler("protocol-weights").result().path
    assert sampler_path.startswith("tinker://")
    service = create_service_client("tinker")
    restored = service.create_lora_training_client(tinker_env.base_model, rank=4, seed=0).result()
    restored.load_state(saved.path).result()
    after = _logprobs(restored, data)
    for a, b in zip(before, after, strict=True):
        assert torch.equal(a, b)
    sampler = service.create_sampling_client(model_path=sampler_path)
    sampler = sampler.result() if hasattr(sampler, "result") else sampler
    params = types.SamplingParams(max_tokens=2, temperature=1.0, seed=0)
    assert (
        len(sampler.sample(types.ModelInput.from_ints(BATCH[1]), 1, params).result().sequences) == 1
    )


def test_restoration_preflight(tinker_env):
    from losslab.backends.restoration import restoration_preflight

    arms = [
        {"name": n, "optimizer": "adamw", "optimizer_config": {"learning_rate": 2e-5, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}}
        for n in ("baseline", "treatment")
    ]  # fmt: skip
    report = restoration_preflight(
        create_service_client("tinker"), base_model=tinker_env.base_model, rank=4, seed=0, arms=arms
    )
    assert report["passed"], report["problems"]
    assert report["logprobs"]["num_tokens"] > 0
    assert report["logprobs"]["max_abs_diff"] <= 1e-6
    assert [o["actual"]["type"] for o in report["optimizers"]] == ["adamw", "adamw"]


def test_losslab_run_backend_tinker_reaches_the_verdict(tinker_env, tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "runner"))
    from _tiny_plan import write_tiny_plan

    plan_file = write_tiny_plan(tmp_path / "plan.json", Path(tinker_env.base_model))
    plan = json.loads(plan_file.read_text())
    plan["base_model"] = tinker_env.base_model  # what the tinker backend asks the server for
    plan["engine"].pop("local_base_model")
    plan_file.write_text(json.dumps(plan, indent=1))
    out = tmp_path / "run"
    from typer.testing import CliRunner

    from losslab.cli import app

    # In this process, so the SDK shims apply to the run's clients too.
    result = CliRunner().invoke(
        app, ["run", str(plan_file), "--backend", "tinker", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output[-4000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert f"verdict: {verdict['verdict']}" in result.output
    executed = json.loads((out / "executed_config.json").read_text())
    assert "lora_rank" in json.dumps(executed)
    texts = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert not any(TEST_KEY in t for t in [*texts, result.output])

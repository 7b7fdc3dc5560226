"""The Tinker SDK 0.38 surface of the local clients: signatures mirror the installed SDK, client
futures act as the client, `.coroutine()`, the `*_async` methods, the REST client, server
capabilities, clear errors for what cannot exist locally, and sampling coalesced per tick."""

from __future__ import annotations

import asyncio
import inspect
import math

import pytest
import tinker
import torch
from tinker import types

from losslab.backends.futures import ClientFuture
from losslab.backends.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from losslab.backends.local.rest import LocalRestClient
from losslab.backends.local.sdk_surface import NotAvailableLocally

from .conftest import rl_batch

TRAINING = [
    "forward", "forward_async", "forward_backward", "forward_backward_async",
    "forward_backward_custom", "forward_backward_custom_async", "optim_step", "optim_step_async",
    "save_state", "save_state_async", "load_state", "load_state_async",
    "load_state_with_optimizer", "load_state_with_optimizer_async", "save_weights_for_sampler",
    "save_weights_for_sampler_async", "save_weights_external", "save_weights_external_async",
    "get_info", "get_info_async", "get_tokenizer", "create_sampling_client",
    "create_sampling_client_async", "save_weights_and_get_sampling_client",
    "save_weights_and_get_sampling_client_async", "get_telemetry", "get_console_url",
]  # fmt: skip
SAMPLING = [
    "sample", "sample_async", "compute_logprobs", "compute_logprobs_async", "get_tokenizer",
    "get_base_model", "get_base_model_async", "get_telemetry", "get_sampler_handle",
    "on_queue_state_change",
]  # fmt: skip
SERVICE = [
    "create_lora_training_client", "create_training_client_from_state",
    "create_training_client_from_state_with_optimizer", "create_sampling_client",
    "create_sampling_client_async", "get_server_capabilities", "get_server_capabilities_async",
    "create_rest_client", "get_telemetry", "get_console_url", "copy_weights",
    "create_custom_loss", "close",
]  # fmt: skip
# deprecated SDK forwarders, written locally as (*args, **kwargs) -> the sync method
FORWARDERS = {
    "create_lora_training_client_async",
    "create_training_client_from_state_async",
    "create_training_client_from_state_with_optimizer_async",
}
REST = [
    "get_training_run", "get_training_run_async", "get_training_run_by_tinker_path",
    "get_training_run_by_tinker_path_async", "get_weights_info_by_tinker_path",
    "list_training_runs", "list_training_runs_async", "list_checkpoints",
    "list_checkpoints_async", "delete_checkpoint", "delete_checkpoint_async",
    "delete_checkpoint_from_tinker_path", "delete_checkpoint_from_tinker_path_async",
    "list_user_checkpoints", "list_user_checkpoints_async", "get_server_capabilities",
    "get_telemetry",
]  # fmt: skip


def _check_mirrors(sdk_fn, local_fn, where):
    """Every SDK parameter is accepted locally under its name, in order, with the SDK's default
    (a local default where the SDK has none is allowed); local extras are keyword-only or
    **kwargs; sync vs async matches the SDK."""
    sdk_async = inspect.iscoroutinefunction(inspect.unwrap(sdk_fn))  # unwrap SDK telemetry
    assert sdk_async == inspect.iscoroutinefunction(local_fn), where
    sdk = [p for p in inspect.signature(sdk_fn).parameters.values() if p.name != "self"]
    local = [p for p in inspect.signature(local_fn).parameters.values() if p.name != "self"]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in local)
    named = [p for p in local if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for i, s in enumerate(sdk):
        if i >= len(named) or named[i].name != s.name:
            assert var_kw and all(p.name != s.name for p in named), f"{where}: {s.name}"
            continue
        mine = named[i]
        if s.default is not s.empty:
            assert mine.default == s.default, f"{where}: default of {s.name}"
        if s.kind is s.KEYWORD_ONLY:
            assert mine.kind is mine.KEYWORD_ONLY, f"{where}: {s.name} is keyword-only"
    for extra in named[len(sdk) :]:
        assert extra.kind is extra.KEYWORD_ONLY, f"{where}: extra {extra.name} must be kw-only"


@pytest.mark.parametrize(
    "sdk_cls, local_cls, names",
    [
        (tinker.TrainingClient, LocalTrainingClient, TRAINING),
        (tinker.SamplingClient, LocalSamplingClient, SAMPLING),
        (tinker.ServiceClient, LocalServiceClient, SERVICE),
        (tinker.RestClient, LocalRestClient, REST),
    ],
)
def test_signatures_mirror_the_installed_sdk(sdk_cls, local_cls, names):
    for name in names:
        _check_mirrors(
            getattr(sdk_cls, name), getattr(local_cls, name), f"{local_cls.__name__}.{name}"
        )
    for name in FORWARDERS & set(dir(sdk_cls)):
        assert inspect.iscoroutinefunction(getattr(local_cls, name))


def test_client_futures_act_as_the_client(service, tiny_llama):
    fut = service.create_lora_training_client(tiny_llama, rank=4, seed=0)
    assert isinstance(fut, ClientFuture)
    # the 0.5.8 rl_loop style: the future used as the client, with the SDK's FutureWarning
    with pytest.warns(FutureWarning, match="Call .result"):
        out = fut.forward_backward(rl_batch(0), "importance_sampling").result()
    again = fut.result().forward(rl_batch(0), "importance_sampling").result()
    assert math.isclose(out.metrics["loss:sum"], again.metrics["loss:sum"], rel_tol=1e-6)
    with pytest.warns(FutureWarning):
        sampler_fut = fut.save_weights_and_get_sampling_client()
    with pytest.warns(FutureWarning):
        assert sampler_fut.get_base_model() == fut.result().get_info().model_data.model_name
    with pytest.raises(AttributeError):
        fut._private_thing  # noqa: B018  (private names are never forwarded)


def test_coroutine_and_async_methods(service, tiny_llama):
    async def main():
        tc = await service.create_lora_training_client(tiny_llama, rank=4, seed=0)
        fb = await tc.forward_backward_async(rl_batch(0), "importance_sampling")  # a future
        step = await tc.optim_step_async(types.AdamParams(learning_rate=0.01))
        fb_out, step_out = await fb, await step.result_async()
        sampler = await tc.save_weights_and_get_sampling_client_async(record_stability_info=True)
        prompt = types.ModelInput.from_ints([257, 84, 82, 68])
        task = asyncio.create_task(sampler.compute_logprobs(prompt).coroutine())
        response = await sampler.sample_async(prompt, 2, types.SamplingParams(max_tokens=3))
        logprobs = await task
        direct = await sampler.compute_logprobs_async(prompt)
        return fb_out, step_out, response, logprobs, direct, await tc.get_info_async()

    fb_out, step_out, response, logprobs, direct, info = asyncio.run(main())
    assert isinstance(fb_out, types.ForwardBackwardOutput) and "loss:sum" in fb_out.metrics
    assert step_out.metrics["step:max"] == 1.0
    assert isinstance(response, types.SampleResponse) and len(response.sequences) == 2
    assert logprobs[0] is None and logprobs == direct and len(logprobs) == 4
    assert info.lora_rank == 4


def test_sampler_path_and_state_of_one_name_coexist_and_reopen(service, tiny_llama):
    """The cookbook saves kind="both" with ONE name; Tinker keeps weights/ and sampler_weights/
    apart, so the local folders must not overwrite each other."""
    tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    state = tc.save_state("000002").result().path
    sampler = tc.save_weights_for_sampler("000002").result().path
    assert state != sampler
    reopened = tc.create_sampling_client(sampler, record_stability_info=True).result()
    seq = (
        reopened.sample(
            types.ModelInput.from_ints([257, 84]), 1, types.SamplingParams(max_tokens=2)
        )
        .result()
        .sequences[0]
    )
    assert service.recorded_stability_info(seq.sequence_id)
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    assert resumed.optimizer_config() == tc.optimizer_config()


def test_rest_client_reports_runs_and_checkpoints_and_deletes(service, tiny_llama):
    tc = service.create_lora_training_client(
        tiny_llama, rank=4, seed=0, user_metadata={"renderer_name": "role_colon"}
    ).result()
    state = tc.save_state("a").result().path
    sampler = tc.save_weights_for_sampler("a").result().path
    rest = service.create_rest_client()
    run = rest.get_training_run_by_tinker_path(state).result()
    assert isinstance(run, types.TrainingRun)
    assert run.training_run_id == tc.get_info().model_id and run.lora_rank == 4
    assert run.user_metadata == {"renderer_name": "role_colon"}
    assert run.last_checkpoint.tinker_path == state
    assert run.last_sampler_checkpoint.tinker_path == sampler
    listed = rest.list_checkpoints(run.training_run_id).result().checkpoints
    assert {(c.checkpoint_id, c.checkpoint_type) for c in listed} == {
        ("a", "training"),
        ("sampler_weights/a", "sampler"),
    }
    assert rest.get_weights_info_by_tinker_path(sampler).result().lora_rank == 4
    asyncio.run(rest.delete_checkpoint_from_tinker_path_async(state))
    rest.delete_checkpoint(run.training_run_id, "sampler_weights/a").result()
    assert rest.list_checkpoints(run.training_run_id).result().checkpoints == []
    with pytest.raises(ValueError, match="not a local checkpoint"):
        rest.get_training_run_by_tinker_path(state)
    with pytest.raises(ValueError, match="points outside run"):
        rest.delete_checkpoint(run.training_run_id, "../../elsewhere")
    with pytest.raises(NotAvailableLocally, match="RestClient.get_billing_usage needs the Tinker"):
        rest.get_billing_usage("2026-01-01", "2026-02-01")


def test_server_capabilities_have_the_sdk_type(service):
    caps = service.get_server_capabilities()
    assert isinstance(caps, types.GetServerCapabilitiesResponse)
    assert caps == asyncio.run(service.get_server_capabilities_async())
    assert caps == service.create_rest_client().get_server_capabilities().result()
    assert all(m.trainable and m.sampleable for m in caps.supported_models)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s, t, p: t.save_weights_external("x"), "save_weights_external"),
        (lambda s, t, p: t.get_console_url(), "Tinker Console"),
        (lambda s, t, p: p.get_sampler_handle(), "get_sampler_handle"),
        (lambda s, t, p: s.copy_weights("x"), "copy_weights"),
        (lambda s, t, p: s.create_rest_client().get_billing_usage("a", "b"), "get_billing_usage"),
    ],
)
def test_what_needs_the_service_says_so(service, tiny_llama, call, match):
    tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    with pytest.raises(
        NotAvailableLocally,
        match=f"(?s)needs the Tinker service.*{match}|{match}.*needs the Tinker service",
    ):
        call(service, tc, sampler)


def test_requests_in_one_tick_run_as_one_generation(service, tiny_llama, monkeypatch):
    """2 groups x 4 envs, each env awaiting its own sample right away (the cookbook's rollout
    shape): the 8 requests run as ONE batched generation, as when all are submitted first."""
    tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    batches: list[int] = []
    real_run = LocalSamplingClient._run

    def spy(self, batch):
        batches.append(len(batch))
        return real_run(self, batch)

    monkeypatch.setattr(LocalSamplingClient, "_run", spy)
    params = types.SamplingParams(max_tokens=3, seed=0)

    async def env(prompt):
        await asyncio.sleep(0)  # an env doing its own async setup first
        return await sampler.sample(types.ModelInput.from_ints(prompt), 1, params)

    async def group(g):
        return await asyncio.gather(*[env([257, 84 + g, 82 + e]) for e in range(4)])

    async def main():
        return await asyncio.gather(group(0), group(1))

    out = asyncio.run(main())
    assert batches == [8]
    assert [len(r.sequences) for grp in out for r in grp] == [1] * 8
    # one-by-one `.result()` still runs each on its own
    sampler.sample(types.ModelInput.from_ints([257]), 1, params).result()
    assert batches == [8, 1]


def test_create_custom_loss_handle_runs_like_the_callable(service, tiny_llama):
    """A LossHandle (the SDK's own tracing) gives the gradient of the same per-datum loss
    written as a callable; its metrics reduce by suffix (:sum adds, :mean averages)."""

    def is_loss(logprobs, logprobs_ref, advantages):  # per datum, torch only (traceable)
        loss = -(torch.exp(logprobs - logprobs_ref) * advantages).sum()
        return loss, {"custom/is:sum": loss, "custom/tokens:mean": logprobs.shape[0] * 1.0}

    def renamed(data):  # the handle reads loss_fn_inputs by parameter name
        return [
            types.Datum(
                d.model_input, {**d.loss_fn_inputs, "logprobs_ref": d.loss_fn_inputs["logprobs"]}
            )
            for d in data
        ]

    handle = service.create_custom_loss(
        is_loss, {"logprobs": 1, "logprobs_ref": 1, "advantages": 1}
    ).result()
    a = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    b = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    for tc in (a, b):  # non-zero LoRA B, so gradients reach every matrix
        tc.forward_backward(rl_batch(1), "importance_sampling").result()
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    data = renamed(rl_batch(0))
    out_a = a.forward_backward_custom(data, handle).result()

    def batch_loss(batch, logprobs_list):  # the same loss as a plain forward_backward_custom fn
        per_datum = [
            is_loss(
                lp,
                d.loss_fn_inputs["logprobs"].to_torch(),
                d.loss_fn_inputs["advantages"].to_torch(),
            )[0]
            for d, lp in zip(batch, logprobs_list, strict=True)
        ]
        return torch.stack(per_datum).sum(), {}

    out_b = b.forward_backward_custom(data, batch_loss).result()
    ga, gb = a.lora_grads(), b.lora_grads()
    assert max(float(v.abs().max()) for v in ga.values()) > 1e-5
    assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) <= 1e-6
    assert abs(out_a.metrics["custom/is:sum"] - out_b.metrics["loss:sum"]) <= 1e-5
    assert out_a.metrics["custom/tokens:mean"] == (11 + 8 + 14) / 3
    other = LocalServiceClient(device="cpu", state_dir=service.state_dir)
    foreign = other.create_custom_loss(
        is_loss, {"logprobs": 1, "logprobs_ref": 1, "advantages": 1}
    ).result()
    with pytest.raises(ValueError, match="only be used by clients of that session"):
        a.forward_backward_custom(data, foreign)
    with pytest.raises(ValueError, match="has no loss_fn_inputs\\['logprobs_ref'\\]"):
        a.forward_backward_custom(rl_batch(0), handle)

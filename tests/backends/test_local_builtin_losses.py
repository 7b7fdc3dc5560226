"""gspo and stable_reinforce as local built-ins: hand-derived values and gradients, the
documented preconditions, and built-in vs forward_backward_custom with the same formula."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from tinker import types

from losslab.backends.local import builtin_losses
from losslab.backends.local.builtin_losses import (
    check_stable_reinforce,
    gspo_loss,
    stable_reinforce_loss,
)
from losslab.backends.local.sdk_surface import NotAvailableLocally

from .conftest import rl_batch
from .test_local_training import _max_abs, _trained


def _datum(n, q, a, mask=None, spans=None):
    d = types.Datum(
        model_input=types.ModelInput.from_ints(list(range(3, 3 + n))),
        loss_fn_inputs={
            "target_tokens": list(range(4, 4 + n)),
            "logprobs": q,
            "advantages": a,
            **({"sequence_ratio_mask": mask} if mask is not None else {}),
        },
    )
    return d if spans is None else d.with_provenance(*spans)


def _lp(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


# ---------------------------------------------------------------------------------- GSPO
def test_gspo_hand_derived_value_and_gradient():
    """lp - q = [0.3 (unmasked), -0.1, 0.0] with mask [0, 1, 1]: the sequence log-ratio is the
    mean over the marked tokens, (-0.1 + 0) / 2 = -0.05, so s = e^-0.05 = 0.951229 on EVERY
    token (the unmasked one too, with A = 0.5). No clip is active at 0.8/1.2, so
    L = -s * (0.5 + 1 + 1) = -2.378073 and dL/dlp_t = -A_t * s = [-0.475615, -0.951229, -0.951229]."""
    d = _datum(3, [-1.3, -1.9, -0.5], [0.5, 1.0, 1.0], mask=[0.0, 1.0, 1.0])
    lp = _lp([-1.0, -2.0, -0.5])
    loss = gspo_loss([d], [lp], {})
    s = math.exp(-0.05)
    assert math.isclose(float(loss.detach()), -s * 2.5, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([-0.5 * s, -s, -s]), atol=1e-6)


def test_gspo_clip_drops_the_whole_sequence_in_the_advantage_direction():
    """Same datum, bounds 0.5/0.9: s = 0.951 > 0.9. For A > 0 the clipped term 0.9*A is the
    min, which has no gradient (L = -0.9 * 2.5 = -2.25, grad 0); for A < 0 the unclipped s*A
    is the min (L = +s * 2.5, dL/dlp_t = -A_t * s = [0.5 s, s, s])."""
    lp = _lp([-1.0, -2.0, -0.5])
    pos = _datum(3, [-1.3, -1.9, -0.5], [0.5, 1.0, 1.0], mask=[0.0, 1.0, 1.0])
    loss = gspo_loss([pos], [lp], {"clip_low_threshold": 0.5, "clip_high_threshold": 0.9})
    assert math.isclose(float(loss.detach()), -2.25, rel_tol=1e-6)
    loss.backward()
    assert float(lp.grad.abs().max()) == 0.0
    lp2 = _lp([-1.0, -2.0, -0.5])
    neg = _datum(3, [-1.3, -1.9, -0.5], [-0.5, -1.0, -1.0], mask=[0.0, 1.0, 1.0])
    loss2 = gspo_loss([neg], [lp2], {"clip_low_threshold": 0.5, "clip_high_threshold": 0.9})
    s = math.exp(-0.05)
    assert math.isclose(float(loss2.detach()), s * 2.5, rel_tol=1e-6)
    loss2.backward()
    assert torch.allclose(lp2.grad, torch.tensor([0.5 * s, s, s]), atol=1e-6)


def test_gspo_errors_name_the_problem():
    lp = _lp([-1.0, -2.0])
    with pytest.raises(ValueError, match=r"data\[0\].*sequence_ratio_mask'\] marks no token"):
        gspo_loss([_datum(2, [-1.0, -2.0], [1.0, 1.0], mask=[0.0, 0.0])], [lp], {})
    with pytest.raises(ValueError, match="clip_low_threshold=1.5 and clip_high_threshold=1.2"):
        gspo_loss(
            [_datum(2, [-1.0, -2.0], [1.0, 1.0], mask=[1.0, 1.0])],
            [lp],
            {"clip_low_threshold": 1.5},
        )


# ---------------------------------------------------------------------------------- StableReinforce
def _sr_datum(seq_id="lab/0/0", adv=(0.0, 1.0, 1.0)):
    """Prompt token at position 0, two sampled tokens (the cookbook's provenance layout)."""
    spans = (
        [
            types.PromptProvenanceSpan(sequence_id=seq_id, length=2),
            types.SampledProvenanceSpan(sequence_id=seq_id, length=1),
        ],
        [
            types.PromptProvenanceSpan(sequence_id=seq_id, offset=1, length=1),
            types.SampledProvenanceSpan(sequence_id=seq_id, length=2),
        ],
    )
    return _datum(3, [0.0, -1.0 - math.log(2.0), -0.5], list(adv), spans=spans)


def test_stable_reinforce_hand_derived_value_and_gradient():
    """lp - q = [-1 (A = 0, prompt), ln 2, 0]: L = -(2 * 1 + 1 * 1) = -3, dL/dlp = -r * A =
    [0, -2, -1] (the importance-sampling objective, see builtin_losses' docstring)."""
    lp = _lp([-1.0, -1.0, -0.5])
    builtin_losses._warned_stand_in = False  # the warning is once per process
    with pytest.warns(UserWarning, match="StableReinforce objective is not published"):
        loss = stable_reinforce_loss([_sr_datum()], [lp], {}, recorded=lambda s: True)
    assert math.isclose(float(loss.detach()), -3.0, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([0.0, -2.0, -1.0]), atol=1e-6)


def test_stable_reinforce_enforces_the_documented_preconditions():
    with pytest.raises(ValueError, match=r"data\[0\] has no provenance"):
        check_stable_reinforce([_datum(3, [0.0] * 3, [0.0, 1.0, 1.0])], None)
    with pytest.raises(ValueError, match=r"advantages'\]\[0\] = 0.5 is on a position no Sampled"):
        check_stable_reinforce([_sr_datum(adv=(0.5, 1.0, 1.0))], None)
    with pytest.raises(ValueError, match="'other/0/0'.*record_stability_info=True"):
        check_stable_reinforce([_sr_datum("other/0/0")], lambda s: s.startswith("lab/"))
    with pytest.raises(NotAvailableLocally, match="kl_coeff=0.1"):
        stable_reinforce_loss([_sr_datum()], [_lp([0.0] * 3)], {"kl_coeff": 0.1}, None)


# ---------------------------------------------------------------------------------- on the model
def _gspo_custom(data, logprobs_list):
    """The Tinker docs' GSPO snippet, written out again for forward_backward_custom."""
    total = torch.zeros(())
    for d, lp in zip(data, logprobs_list, strict=True):
        ref = d.loss_fn_inputs["logprobs"].to_torch()
        adv = d.loss_fn_inputs["advantages"].to_torch()
        in_ratio = d.loss_fn_inputs["sequence_ratio_mask"].to_torch() != 0
        log_ratio = (lp.detach() - ref)[in_ratio].mean()
        ratio = torch.exp(log_ratio + lp - lp.detach())
        clipped = torch.clamp(ratio, 0.8, 1.2)
        total = total - torch.min(ratio * adv, clipped * adv).sum()
    return total, {}


def _with_ratio_mask(data):
    out = []
    for d in data:
        mask = (d.loss_fn_inputs["advantages"].to_torch() != 0).float()
        out.append(types.Datum(d.model_input, {**d.loss_fn_inputs, "sequence_ratio_mask": mask}))
    return out


def test_builtin_gspo_equals_custom_gspo_on_the_model(service, tiny_llama):
    data = _with_ratio_mask(rl_batch(0))
    a, b = _trained(service, tiny_llama), _trained(service, tiny_llama)
    out_a = a.forward_backward(data, "gspo").result()
    out_b = b.forward_backward_custom(data, _gspo_custom).result()
    ga, gb = a.lora_grads(), b.lora_grads()
    scale = max(float(v.abs().max()) for v in ga.values())
    assert scale > 1e-5  # a real gradient reached the LoRA weights
    assert _max_abs(ga, gb) <= 1e-6 * max(1.0, scale)
    assert math.isclose(out_a.metrics["loss:sum"], out_b.metrics["loss:sum"], rel_tol=1e-6)


def _cookbook_datum(prompt, seq, adv, sequence_id):
    """The rl_loop.py datum with its with_sampled_provenance spans (tinker-cookbook 0.6.1)."""
    ob = len(prompt) - 1
    d = types.Datum(
        model_input=types.ModelInput.from_ints(prompt + seq.tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": [0] * ob + seq.tokens,
            "logprobs": [0.0] * ob + seq.logprobs,
            "advantages": [0.0] * ob + [adv] * len(seq.tokens),
        },
    )
    return d.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, length=len(prompt)),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=len(seq.tokens) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=ob),
            types.SampledProvenanceSpan(sequence_id=sequence_id, length=len(seq.tokens)),
        ],
    )


def _is_custom(data, logprobs_list):
    total = torch.zeros(())
    for d, lp in zip(data, logprobs_list, strict=True):
        q = d.loss_fn_inputs["logprobs"].to_torch()
        adv = d.loss_fn_inputs["advantages"].to_torch()
        total = total - (torch.exp(lp - q) * adv).sum()
    return total, {}


def test_builtin_stable_reinforce_equals_custom_on_recorded_samples(service, tiny_llama):
    """Sample with record_stability_info=True, build provenance datums as the cookbook does,
    and compare the built-in with a custom -sum(exp(lp - q) * A)."""
    a, b = _trained(service, tiny_llama), _trained(service, tiny_llama)
    sampler = a.save_weights_and_get_sampling_client(record_stability_info=True).result()
    prompt = [257, 84, 82, 68, 81, 198]
    params = types.SamplingParams(max_tokens=5, seed=1)
    resp = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    data = [
        _cookbook_datum(prompt, seq, adv, seq.sequence_id)
        for seq, adv in zip(resp.sequences, (1.0, -1.0), strict=True)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out_a = a.forward_backward(data, "stable_reinforce").result()
    out_b = b.forward_backward_custom(data, _is_custom).result()
    ga, gb = a.lora_grads(), b.lora_grads()
    scale = max(float(v.abs().max()) for v in ga.values())
    assert scale > 1e-5
    assert _max_abs(ga, gb) <= 1e-6 * max(1.0, scale)
    assert math.isclose(out_a.metrics["loss:sum"], out_b.metrics["loss:sum"], rel_tol=1e-5)
    # sequences from a sampler created WITHOUT record_stability_info are refused, like Tinker
    plain = a.save_weights_and_get_sampling_client().result()
    plain_id = plain.sample(types.ModelInput.from_ints(prompt), 1, params).result()
    bad = _cookbook_datum(prompt, resp.sequences[0], 1.0, plain_id.sequences[0].sequence_id)
    with pytest.raises(ValueError, match="record_stability_info=True"):
        a.forward_backward([bad], "stable_reinforce")


def test_builtin_view_keeps_provenance_and_drops_client_keys():
    """`datums.tinker_visible` (used by the local AND the Tinker backend) must not strip the
    spans stable_reinforce reads; it still drops client-only keys such as `mask`."""
    from losslab.backends.datums import tinker_visible

    d = _sr_datum()
    d = types.Datum(
        d.model_input,
        {**d.loss_fn_inputs, "mask": torch.tensor([0.0, 1.0, 1.0])},
        d.model_input_spans,
        d.loss_fn_input_spans,
    )
    seen = tinker_visible(d, "stable_reinforce")
    assert seen.loss_fn_input_spans == d.loss_fn_input_spans
    assert seen.model_input_spans == d.model_input_spans
    assert sorted(seen.loss_fn_inputs) == ["advantages", "logprobs", "target_tokens"]

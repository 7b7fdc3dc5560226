"""Tinker's `gspo` and `stable_reinforce` built-in losses on the local backend.

The other built-ins (importance_sampling, ppo, cispo, dro, cross_entropy) come from
`losslab.losses`; these two read datum fields those losses do not carry (a per-datum
`sequence_ratio_mask`, provenance spans), so they live here, next to the training client that
calls them. Like every Tinker built-in they SUM over tokens and datums.

`gspo` (Tinker docs, "GSPO"; Zheng et al. 2025, arXiv 2507.18071, the token-level variant):
per datum, over the tokens M that `sequence_ratio_mask` marks,

    s      = exp( mean_{t in M} (sg(ℓ_t) − q_t) )          the sequence ratio (a value)
    s_t    = s · exp(ℓ_t − sg(ℓ_t))                         its value, token t's own gradient
    L      = −Σ_t min(s_t·A_t, clip(s_t, lo, hi)·A_t)

so every token carries the sequence ratio and the gradient −A_t·s of its own log-prob where the
clip is inactive. `loss_fn_config` keys `clip_low_threshold` / `clip_high_threshold` are
absolute bounds as for `ppo`; Tinker's docs do not state GSPO's defaults, so the local ones are
`ppo`'s 0.8 / 1.2 (the GSPO paper clips far tighter, 3e-4 / 4e-4 around 1: pass them if you
want the paper's setting). A datum whose mask marks no token has no sequence ratio: an error.

`stable_reinforce` (Tinker docs, "StableReinforce", alpha): Tinker publishes its preconditions,
not its objective, which uses "stability information" the server records at sampling time. The
local built-in enforces the documented preconditions exactly:

* every datum carries provenance (`Datum.with_provenance`, as the cookbook's
  `assemble_training_data` and `rl_loop.with_sampled_provenance` attach);
* nonzero advantages only on sampled tokens (positions a `SampledProvenanceSpan` covers);
* every named sequence was sampled by a client created with `record_stability_info=True`
  (in this service);

and then computes the REINFORCE importance-sampling objective L = −Σ_t e^(ℓ_t − q_t)·A_t (the
`importance_sampling` loss). On on-policy data (ℓ = q, as the local sampler and trainer agree
to ~1e-5) its gradient is REINFORCE's −A_t·∇ℓ_t; off-policy it is NOT Tinker's objective, and a
one-time warning says so. `kl_coeff` (documented as accepted, formula unpublished) must be 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import torch
from tinker import types

from losslab.backends.local.sdk_surface import NotAvailableLocally

LOCAL_BUILTINS = ("gspo", "stable_reinforce")
GSPO_DEFAULT_CLIP = (0.8, 1.2)

_warned_stand_in = False


def _input(datum: types.Datum, key: str, like: torch.Tensor) -> torch.Tensor:
    return datum.loss_fn_inputs[key].to_torch().to(like.device, torch.float32).reshape(like.shape)


def gspo_loss(
    data: list[types.Datum], logprobs_D: list[torch.Tensor], config: Mapping[str, float]
) -> torch.Tensor:
    """Tinker's GSPO-token loss, summed over tokens and datums (module docstring)."""
    lo = float(config.get("clip_low_threshold", GSPO_DEFAULT_CLIP[0]))
    hi = float(config.get("clip_high_threshold", GSPO_DEFAULT_CLIP[1]))
    if not 0 <= lo <= hi:
        raise ValueError(
            f"gspo: clip_low_threshold={lo} and clip_high_threshold={hi}; expected "
            "0 <= clip_low_threshold <= clip_high_threshold (absolute ratio bounds)"
        )
    total = logprobs_D[0].new_zeros(())
    for i, (datum, lp_T) in enumerate(zip(data, logprobs_D, strict=True)):
        q_T = _input(datum, "logprobs", lp_T)
        a_T = _input(datum, "advantages", lp_T)
        in_ratio_T = _input(datum, "sequence_ratio_mask", lp_T) != 0
        if not bool(in_ratio_T.any()):
            raise ValueError(
                f"data[{i}].loss_fn_inputs['sequence_ratio_mask'] marks no token; GSPO's sequence "
                "ratio is the mean log-ratio over the marked (sampled) tokens, so mark at least one"
            )
        log_ratio = (lp_T.detach() - q_T)[in_ratio_T].mean()
        ratio_T = torch.exp(log_ratio + lp_T - lp_T.detach())
        clipped_T = ratio_T.clamp(lo, hi)
        total = total - torch.minimum(ratio_T * a_T, clipped_T * a_T).sum()
    return total


def _span_mask(spans: list, length: int) -> tuple[torch.Tensor, list[str]]:
    """(bool [length]: position is a sampled token, the sequence ids the spans name)."""
    sampled_T = torch.zeros(length, dtype=torch.bool)
    ids, start = [], 0
    for span in spans:
        ids.append(span.sequence_id)
        if isinstance(span, types.SampledProvenanceSpan):
            sampled_T[start : start + span.length] = True
        start += span.length
    return sampled_T, ids


def check_stable_reinforce(data: list[types.Datum], recorded: Callable[[str], bool] | None) -> None:
    """Raise ValueError naming the datum when a documented precondition fails."""
    for i, datum in enumerate(data):
        spans = datum.loss_fn_input_spans
        if spans is None:
            raise ValueError(
                f"data[{i}] has no provenance; loss_fn='stable_reinforce' needs every datum to "
                "name the sampled sequence behind its tokens (Datum.with_provenance(...) with the "
                "sequence_id of each SampledSequence), or train with another loss_fn"
            )
        advantages_T = datum.loss_fn_inputs["advantages"].to_torch().reshape(-1)
        sampled_T, ids = _span_mask(spans, advantages_T.numel())
        off_sample_T = (advantages_T != 0) & ~sampled_T
        if bool(off_sample_T.any()):
            t = int(off_sample_T.nonzero()[0, 0])
            raise ValueError(
                f"data[{i}].loss_fn_inputs['advantages'][{t}] = {float(advantages_T[t])} is on a "
                "position no SampledProvenanceSpan covers; stable_reinforce allows nonzero "
                "advantages only on sampled tokens"
            )
        for sequence_id in ids:
            if recorded is not None and not recorded(sequence_id):
                raise ValueError(
                    f"data[{i}] names sequence_id {sequence_id!r}, which no sampling client "
                    "created with record_stability_info=True sampled in this service; create the "
                    "sampling client with record_stability_info=True (as the cookbook does for "
                    "stable_reinforce)"
                )


def stable_reinforce_loss(
    data: list[types.Datum],
    logprobs_D: list[torch.Tensor],
    config: Mapping[str, float],
    recorded: Callable[[str], bool] | None,
) -> torch.Tensor:
    """The local stand-in for Tinker's stable_reinforce (module docstring): preconditions
    checked, then −Σ e^(ℓ − q)·A."""
    global _warned_stand_in
    kl_coeff = float(config.get("kl_coeff", 0.0))
    if kl_coeff != 0:
        raise NotAvailableLocally(
            f"stable_reinforce with loss_fn_config kl_coeff={kl_coeff} (its formula is not "
            "published)",
            "put the KL penalty into the advantages (the cookbook's kl_penalty_coef does) and "
            "pass kl_coeff=0",
        )
    check_stable_reinforce(data, recorded)
    if not _warned_stand_in:
        _warned_stand_in = True
        warnings.warn(
            "loss_fn='stable_reinforce' on the local backend: Tinker's StableReinforce "
            "objective is not published; the local built-in checks its documented "
            "preconditions and computes -sum(exp(logp - sampler_logp) * A) (REINFORCE's "
            "gradient on on-policy data). Off-policy numbers are not Tinker's.",
            UserWarning,
            stacklevel=3,
        )
    from losslab.losses import TokenData, get_loss

    batch = TokenData.from_datums(data, logprobs_D)
    return get_loss("importance_sampling", reduction="sum")(batch).loss


def local_builtin_loss(
    loss_fn: str,
    data: list[types.Datum],
    logprobs_D: list[torch.Tensor],
    config: Mapping[str, float],
    recorded: Callable[[str], bool] | None,
) -> torch.Tensor:
    if loss_fn == "gspo":
        return gspo_loss(data, logprobs_D, config)
    if loss_fn == "stable_reinforce":
        return stable_reinforce_loss(data, logprobs_D, config, recorded)
    raise ValueError(f"loss_fn {loss_fn!r} is not one of {LOCAL_BUILTINS}")

"""THUDM/slime's policy losses: `compute_policy_loss` (PPO, Clip-Higher, dual-clip),
`compute_cispo_loss` (slime/utils/ppo_utils.py), GSPO through `compute_gspo_kl`, and the
rollout corrections `vanilla_tis_function` / `icepop_function`
(slime/backends/megatron_utils/loss.py), each executed from the pinned commit.

slime's `policy_loss_function` itself cannot run here (it computes log-probs from Megatron
logits and its reducer `get_sum_of_sample_mean` asks `megatron.core.mpu` for the context-parallel
size), so the adapter replays its composition around the extracted plain-torch functions, line
for line with `policy_loss_function` at the pinned commit:
    ppo_kl = old − ℓ (GSPO: `compute_gspo_kl`, each sample's masked mean, expanded);
    pg = compute_cispo_loss(ppo_kl, ℓ, A, eps_clip, eps_clip_high) for CISPO, else
         compute_policy_loss(ppo_kl, A, eps_clip, eps_clip_high, eps_clip_c);
    with use_tis: pg = tis_function(pg, train_log_probs=old, rollout_log_probs=sampler, ...);
    loss = Σ_i (pg_i·m_i).sum() / max(m_i.sum(), 1) / B
— the reducer is `get_sum_of_sample_mean`'s cp_size = 1 branch (cp_utils.py) with the
default per-sample denominators (one sample per rollout, so `rollout_mask_sums` is each sample's
own mask sum), and `/ B` is the `step_global_batch_size` division of `loss_function`. Since the
TIS functions at this commit return the loss masks unchanged, the masked-IS denominator
question of slime #657 does not arise: the denominator is the original mask either way.
Layout: one 1-D tensor of every sample's tokens concatenated (slime's packed layout; prompt
tokens carry mask 0), advantages broadcast over each sample's tokens.
Old log-probs: without TIS `old` = the sampler's (one pass on a fresh batch, ratio 1 at the
start); with TIS `old` = the fixture's recomputed old log-probs, so the TIS weight
π_old/π_rollout differs from 1 and the PPO ratio is π_θ/π_old. Entropy and KL terms are off
(`entropy_coef` 0, `use_kl_loss` False, slime's defaults).
Defaults from slime/utils/arguments.py at the pinned commit: eps_clip 0.2, eps_clip_high None
(= eps_clip), eps_clip_c None, tis_clip 2.0, tis_clip_low 0.
"""

from __future__ import annotations

import math
from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

REPO = "THUDM/slime"
COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
PPO_PATH = "slime/utils/ppo_utils.py"
TIS_PATH = "slime/backends/megatron_utils/loss.py"
DEFAULTS: dict[str, Any] = {
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "loss": "ppo",
}
# root function -> (loss family when loss="ppo", the arguments it reads)
FUNCTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "compute_policy_loss": ("ppo_clip", ("eps_clip", "eps_clip_high", "eps_clip_c")),
    "compute_cispo_loss": ("cispo", ("eps_clip", "eps_clip_high")),
    "compute_gspo_kl": ("gspo", ("eps_clip", "eps_clip_high", "eps_clip_c")),
    "vanilla_tis_function": (
        "rollout_correction",
        ("eps_clip", "eps_clip_high", "eps_clip_c", "tis_clip", "tis_clip_low", "loss"),
    ),
    "icepop_function": (
        "icepop",
        ("eps_clip", "eps_clip_high", "eps_clip_c", "tis_clip", "tis_clip_low", "loss"),
    ),
}
BATCH_REASON = (
    "batch size: slime divides the per-sample means by step_global_batch_size, every sample "
    "(a sample without a loss token too: 16 on the stress fixture), losslab's "
    "seq-mean-token-mean by the samples with a loss token (15); the global count is a call "
    "argument (num_sequences), not a configuration knob"
)
NO_GUARD_REASON = (
    "guard: slime takes exp(−ppo_kl) bare (no clamp), so a token with log r > 88.7 has an "
    "infinite ratio (an A < 0 token's loss is inf, the token's gradient nan: 0·inf through "
    "the clip or dual clip); losslab's ppo clamps the "
    "log-ratio and has no knob to lift it; " + BATCH_REASON
)


def _number(revision: Revision, key: str, value: Any, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
    return float(value)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    family, keys = FUNCTIONS[revision.function]
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(
        revision, keys, f"slime {revision.function} reads the arguments {list(keys)}"
    )
    params: dict[str, Any] = {}
    notes = []
    for key in keys:
        params[key] = kw.get(key, defaults[key])
        if key not in kw:
            notes.append(f"{key} not given: {params[key]!r}, slime's argparse default ({origin})")
    for key in keys:
        if key != "loss":
            optional = key in ("eps_clip_high", "eps_clip_c")
            params[key] = _number(revision, key, params[key], optional)
    if params.get("eps_clip_high") is None:
        params["eps_clip_high"] = params["eps_clip"]
        notes.append("eps_clip_high None: eps_clip, as slime's arguments validation sets it")
    if params.get("eps_clip_c") is not None and params["eps_clip_c"] <= 1.0:
        raise RevisionError(
            f"revision {revision.text!r}: eps_clip_c = {params['eps_clip_c']}; expected > 1 "
            "(slime asserts it)"
        )
    if "loss" in params and params["loss"] not in ("ppo", "cispo"):
        raise RevisionError(
            f"revision {revision.text!r}: loss = {params['loss']!r}; expected 'ppo' or 'cispo' "
            "(the advantage_estimator's policy loss under the correction)"
        )
    if family == "ppo_clip" and params["eps_clip_c"] is not None:
        family = "dual_clip"
    if family in ("rollout_correction", "icepop") and params["loss"] == "cispo":
        params.pop("eps_clip_c")
    notes.append("losses: Σ over samples of each sample's token mean, / B (step_global_batch_size)")
    return Resolution(params, family, tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each slime setting, or why there is none."""
    p, fn = ref.params, ref.revision.function
    red = {"reduction": "seq-mean-token-mean"}
    if fn == "compute_cispo_loss":
        params = {
            "epsilon_meaning": "one_plus_eps",
            "epsilon_low": p["eps_clip"],
            "epsilon_high": p["eps_clip_high"],
            **red,
        }
        notes = ("slime eps are offsets: 1 − lo, 1 + hi",)
        return LosslabConfig("cispo_eps", params, {}, notes, reason=BATCH_REASON)
    low, high = 1.0 - p["eps_clip"], 1.0 + p["eps_clip_high"]
    if fn == "compute_gspo_kl":
        if p["eps_clip_c"] is not None:
            return LosslabConfig(None, reason="GSPO with dual clip: losslab's gspo has no c")
        params = {
            "level": "sequence",  # the sample's mean log-ratio is differentiated through
            "log_ratio_guard": "none",
            "epsilon_low": p["eps_clip"],
            "epsilon_high": p["eps_clip_high"],
            "zero_adv": "keep",
            **red,
        }
        return LosslabConfig("gspo", params, {}, reason=BATCH_REASON)
    clip = {"clip_low_threshold": low, "clip_high_threshold": high, "zero_adv": "keep"}
    if fn in ("vanilla_tis_function", "icepop_function"):
        if p["loss"] == "cispo":
            return LosslabConfig(
                None,
                reason="CISPO under TIS/IcePop: losslab's rollout correction weights PPO's "
                "clipped objective, not CISPO's",
            )
        if p["eps_clip_c"] is not None:
            return LosslabConfig(
                None, reason="dual clip under TIS/IcePop: losslab's correction has no c"
            )
        common = {"anchor": "recomputed", **clip, **red}
        lo, hi = p["tis_clip_low"], p["tis_clip"]
        if fn == "icepop_function":
            return LosslabConfig(
                "icepop", {"low": lo, "high": hi, **common}, {}, reason=NO_GUARD_REASON
            )
        params = {"level": "token", "mode": "truncate", "cap": hi, "lower": lo, **common}
        return LosslabConfig("rollout_correction", params, {}, reason=NO_GUARD_REASON)
    if p["eps_clip_c"] is None:
        return LosslabConfig(
            "ppo", {**clip, "surrogate": "clipped", **red}, {}, reason=NO_GUARD_REASON
        )
    params = {**clip, "clip_ratio_c": p["eps_clip_c"], **red}
    return LosslabConfig("dual_clip_ppo", params, {}, reason=NO_GUARD_REASON)


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """slime's `policy_loss_function` composition on the packed 1-D layout (runs in
    pinned_runner); `fn` is the revision's root function."""
    import torch

    seqs, p, name = payload["sequences"], payload["params"], payload["function"]
    tis = name in ("vanilla_tis_function", "icepop_function")
    cispo = name == "compute_cispo_loss" or p.get("loss") == "cispo"
    old_key = "old_logprobs" if tis else "sampler_logprobs"

    def run(idx: list[int]) -> tuple[Any, Any]:
        rows = [seqs[i] for i in idx]
        lengths = [len(r["sampler_logprobs"]) for r in rows]
        cur = [torch.tensor(r["current_logprobs"], dtype=torch.float32) for r in rows]
        leaves = [c.requires_grad_(True) for c in cur]
        old = [torch.tensor(r.get(old_key) or r["sampler_logprobs"]) for r in rows]
        rollout = [torch.tensor(r["sampler_logprobs"], dtype=torch.float32) for r in rows]
        masks = [torch.tensor(r["loss_mask"], dtype=torch.float32) for r in rows]
        adv = torch.cat([m * float(r["advantage"]) for m, r in zip(masks, rows, strict=True)])
        log_probs = torch.cat(leaves)
        old_cat = torch.cat(old).float()
        if name == "compute_gspo_kl":
            ppo_kl = fn(
                full_log_probs=leaves,
                full_old_log_probs=[o.float() for o in old],
                local_log_probs=leaves,
                loss_masks=masks,
            )
        else:
            ppo_kl = old_cat - log_probs
        if cispo:
            cispo_fn = fn if name == "compute_cispo_loss" else space["compute_cispo_loss"]
            pg, _ = cispo_fn(ppo_kl, log_probs, adv, p["eps_clip"], p["eps_clip_high"])
        else:
            policy = space["compute_policy_loss"] if name != "compute_policy_loss" else fn
            pg, _ = policy(
                ppo_kl, adv, p["eps_clip"], p["eps_clip_high"], eps_clip_c=p["eps_clip_c"]
            )
        if tis:
            args = rt.Config({"tis_clip": p["tis_clip"], "tis_clip_low": p["tis_clip_low"]})
            pg, masks, _ = fn(
                args,
                pg_loss=pg,
                train_log_probs=[o.float() for o in old],
                rollout_log_probs=rollout,
                loss_masks=masks,
            )
        per_sample = [
            (x * m).sum() / torch.clamp_min(m.sum(), 1)
            for x, m in zip(pg.split(lengths, dim=0), masks, strict=True)
        ]
        loss = sum(per_sample) / len(rows)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        grads = [torch.zeros_like(c) if g is None else g for g, c in zip(grads, cur, strict=True)]
        return loss, grads

    loss, grads = run(list(range(len(seqs))))
    return {
        "loss": float(loss),
        "per_sequence_loss": [float(run([i])[0]) for i in range(len(seqs))],
        "native_metrics": {},
        "grad_D": [g.tolist() for g in grads],
    }


def _example(path: str, function: str, args: str = "") -> str:
    return f"{REPO}@{COMMIT}:{path}::{function}({args})"


FRAMEWORK = Framework(
    name="slime",
    repo=REPO,
    functions=tuple(FUNCTIONS),
    families=("ppo_clip", "dual_clip", "gspo", "cispo", "rollout_correction", "icepop"),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="Σ over samples of each sample's token mean, / B (get_sum_of_sample_mean, cp 1)",
    recorded_defaults=DEFAULTS,
    recorded_commit=COMMIT,
    extra_roots=("compute_policy_loss", "compute_cispo_loss"),
    example_revisions={
        "slime_ppo": _example(PPO_PATH, "compute_policy_loss", "eps_clip=0.2, eps_clip_high=0.28"),
        "slime_dual_clip": _example(PPO_PATH, "compute_policy_loss", "eps_clip_c=3.0"),
        "slime_gspo": _example(
            PPO_PATH, "compute_gspo_kl", "eps_clip=0.0003, eps_clip_high=0.0004"
        ),
        # slime/AReaL/Miles's CISPO: eps offsets from 1, eps_high 4.0 = a cap of 5
        "slime_cispo": _example(PPO_PATH, "compute_cispo_loss", "eps_clip=1.0, eps_clip_high=4.0"),
        # bounds that bind on the fixtures' old/rollout ratios (old = sampler + N(0, 0.3))
        # [0.8, 1.25] binds on both sides (a 0.5 lower bound leaves every stress weight above it,
        # so mutating it would change nothing)
        "slime_tis": _example(TIS_PATH, "vanilla_tis_function", "tis_clip=1.25, tis_clip_low=0.8"),
        "slime_icepop": _example(TIS_PATH, "icepop_function", "tis_clip=1.5, tis_clip_low=0.5"),
    },
)

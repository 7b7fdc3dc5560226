"""verl-project/verl's policy-loss registry (`@register_policy_loss` in
verl/trainer/ppo/core_algos.py): every registered loss other than DPPO (`frameworks/verl.py`).

All of them share one signature, `fn(old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config, rollout_is_weights)`, so one adapter runs each: zero-padded [B, T]
rows, `old_log_prob` = the sampler log-probs in bypass mode (default here, as the DPPO
example) or the recomputed old ones, `rollout_is_weights=None` (no rollout correction).
`config` stands in for verl's `ActorConfig` with its `policy_loss` (`PolicyLossConfig`); every
field not given takes the class default read at the pinned commit
(verl/workers/config/actor.py). Aggregation: verl's `agg_loss` with
`global_batch_info = {dp_size 1, batch_num_tokens 1}` for token-mean (a masked sum, the
Tinker convention); GSPO and SAPO always reduce seq-mean-token-mean, whatever
`loss_agg_mode` says (core_algos.py, both functions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.conformance.frameworks.stable_rl import TINKER_SUM_BATCH_INFO, agg_loss_reduction
from losslab.plan import Revision, RevisionError

REPO = "verl-project/verl"
COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
PATH = "verl/trainer/ppo/core_algos.py"
CONFIG_PATH = "verl/workers/config/actor.py"
ACTOR_KEYS = (
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "tau_pos",
    "tau_neg",
)
POLICY_LOSS_KEYS = (
    "clip_cov_ratio",
    "clip_cov_lb",
    "clip_cov_ub",
    "kl_cov_ratio",
    "ppo_kl_coef",
    "dro_beta",
)
KEYS = (*ACTOR_KEYS, *POLICY_LOSS_KEYS, "bypass_mode", "global_batch_info")
# registered function -> (verl loss_mode, losslab loss family)
FUNCTIONS: dict[str, tuple[str, str]] = {
    "compute_policy_loss_vanilla": ("vanilla", "dual_clip"),
    "compute_policy_loss_gspo": ("gspo", "gspo"),
    "compute_policy_loss_sapo": ("sapo", "sapo"),
    "compute_policy_loss_clip_cov": ("clip_cov", "clip_cov"),
    "compute_policy_loss_kl_cov": ("kl_cov", "kl_cov"),
    "compute_policy_loss_geo_mean": ("geo_mean", "gmpo"),
    "compute_policy_loss_dro": ("dro", "dro"),
    "compute_policy_loss_cispo": ("cispo", "cispo"),
}
SEQ_MEAN_TOKEN_MEAN_ONLY = ("gspo", "sapo")  # their agg_loss call hard-codes the mode
RECORDED_DEFAULTS: dict[str, Any] = {
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "clip_ratio_c": 3.0,
    "loss_agg_mode": "token-mean",
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "clip_cov_ratio": 0.0002,
    "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.0002,
    "ppo_kl_coef": 0.1,
    "dro_beta": None,
}


def read_defaults(files: Any) -> dict[str, Any]:
    out = class_defaults(files, CONFIG_PATH, "ActorConfig", ACTOR_KEYS)
    loss_cfg = class_defaults(files, CONFIG_PATH, "PolicyLossConfig", None)
    out.update({k: loss_cfg.get(k) for k in POLICY_LOSS_KEYS})
    return out


CLIP_COV_REASON = (
    "random draw: Clip-Cov detaches tokens drawn with torch's global RNG (randperm) from the "
    "high-covariance ones; losslab draws with its own seed, so the drawn token can differ"
)


def _vanilla_family(config: Mapping[str, Any], info: Mapping[str, Any]) -> str:
    """verl's `vanilla` is always dual-clip PPO; with the Dr. GRPO aggregation it is verl's
    Dr. GRPO, and with Clip-Higher over a real token mean it is the DAPO recipe's loss."""
    if config["loss_agg_mode"] == "seq-mean-token-sum-norm":
        return "dr_grpo"
    token_mean = config["loss_agg_mode"] == "token-mean" and info.get("batch_num_tokens") != 1
    if token_mean and config["clip_ratio_high"] > config["clip_ratio_low"]:
        return "dapo"
    return "dual_clip"


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(
        revision,
        KEYS,
        f"verl {revision.function} takes ActorConfig fields {list(ACTOR_KEYS)}, "
        f"PolicyLossConfig fields {list(POLICY_LOSS_KEYS)} and bypass_mode",
    )
    mode, family = FUNCTIONS[revision.function]
    notes, config = [], {}
    for key in (*ACTOR_KEYS, *POLICY_LOSS_KEYS):
        if key in kw:
            config[key] = kw[key]
        else:
            config[key] = defaults.get(key)
            notes.append(f"{key} not given: {config[key]!r}, the config default ({origin})")
        value = config[key]
        if key != "loss_agg_mode" and value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RevisionError(
                    f"revision {revision.text!r}: {key} = {value!r}; expected a number"
                )
            if math.isnan(value):
                raise RevisionError(f"revision {revision.text!r}: {key} = nan; expected a number")
    if mode == "dro" and not (config["dro_beta"] or 0) > 0:
        raise RevisionError(
            f"revision {revision.text!r}: dro_beta = {config['dro_beta']!r}; verl's DRO needs "
            "a positive policy_loss.dro_beta"
        )
    if mode in SEQ_MEAN_TOKEN_MEAN_ONLY:
        notes.append(f"verl {mode} reduces seq-mean-token-mean whatever loss_agg_mode says")
        config["loss_agg_mode"] = "seq-mean-token-mean"
    bypass = kw.get("bypass_mode", True)
    if not isinstance(bypass, bool):
        raise RevisionError(
            f"revision {revision.text!r}: bypass_mode = {bypass!r}; expected True/False"
        )
    info = kw.get("global_batch_info")
    if info is None:
        info = dict(TINKER_SUM_BATCH_INFO) if config["loss_agg_mode"] == "token-mean" else {}
    if not isinstance(info, Mapping):
        raise RevisionError(
            f"revision {revision.text!r}: global_batch_info = {info!r}; expected a dict"
        )
    if mode == "vanilla":
        family = _vanilla_family(config, info)
    params = {
        "loss_mode": mode,
        **config,
        "global_batch_info": dict(info),
        "bypass_mode": bypass,
    }
    return Resolution(params, family, tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each verl loss, or why there is none."""
    p = ref.params
    mode = p["loss_mode"]
    red, notes = agg_loss_reduction(p, fixture)
    if not red:
        return LosslabConfig(None, reason="; ".join(notes))
    anchor = "sampler" if p["bypass_mode"] else "recomputed"
    if anchor == "recomputed":
        return LosslabConfig(
            None,
            reason=f"verl {mode} without bypass takes the ratio against recomputed old "
            "log-probs; losslab's ratio is always against the sampler's",
        )
    low, high = 1.0 - p["clip_ratio_low"], 1.0 + p["clip_ratio_high"]
    if mode == "cispo":
        # clip(r, 1 - eps_lo, 1 + eps_hi): verl's eps are offsets from 1, losslab's absolute
        params = {"clip_low_threshold": low, "clip_high_threshold": high, **red}
        return LosslabConfig("cispo", params, {}, ("verl eps_low/high -> 1 - eps, 1 + eps",))
    if mode == "dro":
        return LosslabConfig("dro", {"beta": float(p["dro_beta"]), **red}, {})
    if mode == "vanilla":
        params = {
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "clip_ratio_c": p["clip_ratio_c"],
            "zero_adv": "keep",
            **red,
        }
        notes = ("verl vanilla is dual-clip PPO (c = clip_ratio_c) under every aggregation",)
        if p["loss_agg_mode"] == "seq-mean-token-sum-norm":
            # verl's Dr. GRPO: (1/G) sum_d sum_t L / C, C = loss_scale_factor or the padded
            # width (here the longest full row, prompt included), so norm_constant = G * C
            info = p["global_batch_info"]
            live = [s for s in fixture.sequences if s.loss_mask.any()] if fixture else []
            groups = info.get("global_batch_size") or len(live)
            width = info.get("loss_scale_factor") or (max(fixture.lengths) if fixture else 1)
            params["norm_constant"] = float(groups * width)
            notes += ("verl divides by G * C (C = loss_scale_factor or the padded width)",)
        return LosslabConfig("dual_clip_ppo", params, {}, notes)
    if mode == "gspo":
        # verl gspo is GSPO-token: s_t = sg(s_d) * e^(l - sg l), clipped per token
        params = {
            "level": "token",
            "log_ratio_guard": "verl",  # torch.clamp(log s, max=10): no gradient beyond
            "epsilon_low": p["clip_ratio_low"],
            "epsilon_high": p["clip_ratio_high"],
            "zero_adv": "keep",
            **red,
        }
        return LosslabConfig("gspo", params, {})
    if mode == "sapo":
        params = {"tau_pos": p["tau_pos"], "tau_neg": p["tau_neg"], **red}
        return LosslabConfig("sapo", params, {})
    if mode == "geo_mean":
        # verl's seq-mean divides by every row of the batch, an all-masked one included
        n_rows = float(len(fixture.sequences)) if fixture is not None else 1.0
        params = {
            "log_ratio_low": p["clip_ratio_low"],
            "log_ratio_high": p["clip_ratio_high"],
            "log_ratio_guard": "none",  # verl takes e^delta bare
            "zero_adv": "keep",
            "reduction": "seq-mean-token-sum-norm",
            "norm_constant": n_rows,
        }
        return LosslabConfig("gmpo", params, {}, ("verl divides by every row: C = rows",))
    if mode == "kl_cov":
        params = {
            "kl_cov_ratio": p["kl_cov_ratio"],
            "kl_coef": p["ppo_kl_coef"],
            "log_ratio_guard": "none",
            **red,
        }
        return LosslabConfig("kl_cov", params, {})
    if mode == "clip_cov":
        params = {
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "clip_cov_ratio": p["clip_cov_ratio"],
            "clip_cov_lb": p["clip_cov_lb"],
            "clip_cov_ub": p["clip_cov_ub"],
            "log_ratio_guard": "none",
            "zero_adv": "keep",
            **red,
        }
        return LosslabConfig("clip_cov", params, {}, reason=CLIP_COV_REASON)
    return LosslabConfig(
        None, reason=f"losslab's registry has no {ref.loss_family} loss (verl {mode})"
    )


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of one verl registered policy loss (runs in pinned_runner)."""

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    actor = (
        "clip_ratio",
        "clip_ratio_low",
        "clip_ratio_high",
        "clip_ratio_c",
        "loss_agg_mode",
        "tau_pos",
        "tau_neg",
    )
    loss_keys = (
        "clip_cov_ratio",
        "clip_cov_lb",
        "clip_cov_ub",
        "kl_cov_ratio",
        "ppo_kl_coef",
        "dro_beta",
    )
    fields = {k: p[k] for k in actor}
    fields["policy_loss"] = {"loss_mode": p["loss_mode"], **{k: p[k] for k in loss_keys}}
    fields["global_batch_info"] = p["global_batch_info"]
    # gspo/sapo/cispo assert isinstance(config, ActorConfig): ActorConfig is bound to an empty
    # class in the runner (stub_names), so the stand-in config derives from it
    actor_cls = space.get("ActorConfig")
    if isinstance(actor_cls, type):
        config = type("ActorConfigStandIn", (rt.Config, actor_cls), {})(fields)
    else:
        config = rt.Config(fields)

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        loss, metrics = fn(
            old_log_prob=t.sampler if p["bypass_mode"] else t.old,
            log_prob=t.current,
            advantages=t.advantages,
            response_mask=t.mask,
            loss_agg_mode=p["loss_agg_mode"],
            config=config,
            rollout_is_weights=None,
        )
        return loss, rt.grad(loss, t.current), rt.numeric(metrics)

    return rt.padded_outputs(run, seqs)


def _example(function: str, args: str = "") -> str:
    return f"{REPO}@{COMMIT}:{PATH}::{function}({args})"


FRAMEWORK = Framework(
    name="verl_registry",
    repo=REPO,
    functions=tuple(FUNCTIONS),
    families=tuple(sorted({family for _, family in FUNCTIONS.values()} | {"dapo", "dr_grpo"})),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="verl agg_loss (token-mean with batch_num_tokens=1: a masked sum)",
    read_defaults=read_defaults,
    recorded_defaults=RECORDED_DEFAULTS,
    recorded_commit=COMMIT,
    stub_names=("ActorConfig", "AlgoConfig", "DictConfig"),
    example_revisions={
        "verl_vanilla": _example("compute_policy_loss_vanilla"),
        # the DAPO recipe's loss: Clip-Higher 0.2/0.28 over verl's real token-mean
        "verl_dapo": _example(
            "compute_policy_loss_vanilla",
            "clip_ratio_low=0.2, clip_ratio_high=0.28, global_batch_info={'dp_size': 1}",
        ),
        # verl's Dr. GRPO: seq-mean-token-sum-norm, C = the padded width
        # with a fixed G = 16 and C = 128 (Dr. GRPO's constant, verl's loss_scale_factor)
        "verl_dr_grpo": _example(
            "compute_policy_loss_vanilla",
            "loss_agg_mode='seq-mean-token-sum-norm', global_batch_info={'dp_size': 1, "
            "'global_batch_size': 16, 'loss_scale_factor': 128}",
        ),
        "verl_gspo": _example(
            "compute_policy_loss_gspo", "clip_ratio_low=0.0003, clip_ratio_high=0.0004"
        ),
        "verl_sapo": _example("compute_policy_loss_sapo"),
        "verl_clip_cov": _example("compute_policy_loss_clip_cov"),
        "verl_kl_cov": _example("compute_policy_loss_kl_cov"),
        "verl_geo_mean": _example(
            "compute_policy_loss_geo_mean", "clip_ratio_low=0.4, clip_ratio_high=0.4"
        ),
        "verl_dro": _example("compute_policy_loss_dro", "dro_beta=0.05"),
        "verl_cispo": _example(
            "compute_policy_loss_cispo", "clip_ratio_low=1.0, clip_ratio_high=4.0"
        ),
    },
)

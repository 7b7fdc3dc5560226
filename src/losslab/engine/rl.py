"""One RL step per arm, and an arm as a resumable sequence of steps.

The loop is tinker-cookbook's synchronous RL loop (`rl/train.py`) with the batch split into
`updates_per_batch` minibatches, each trained with `forward_backward_custom` (the arm's loss,
p_old = sampler log-probs) followed by one `optim_step`. It talks only to the Tinker-shaped
client interface, so it runs unchanged on the local backend and on the Tinker service.

Pairing: the data cursor is the step index and every sampling seed is derived from
(arm seed, step, group), so two arms with the same seed see the same prompts in the same order
with the same sampling seeds and differ only in the loss. Resuming at step k repeats exactly what
an uninterrupted run does at step k.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tinker
import torch

from losslab.backends.protocols import TrainingClient
from losslab.engine.datums import (
    Rollout,
    build_datum,
    group_advantages,
    keep_varied_groups,
    split_minibatches,
)
from losslab.losses.tinker_adapter import CustomLossFn
from losslab.tasks.base import ChatRenderer, Problem, Task, batch_for_step

__all__ = [
    "GRAD_NORM",
    "TRAINED_LOSS",
    "ArmConfig",
    "ArmLoop",
    "CustomLossFn",
    "NonFiniteError",
    "assemble_datums",
    "group_diversity",
    "policy_stats",
    "renderer_for",
    "resolve",
    "rl_step",
    "sample_groups",
    "sampling_seed",
    "summarise",
    "train_on_minibatches",
    "train_steps",
]

TRAINED_LOSS = "train/loss_sum"
"""Per-update key: the summed loss `forward_backward_custom` backpropagated (the engine's own
record; the loss's `loss/value` stays the loss's)."""
GRAD_NORM = "grad/logprob_norm"
"""Per-update key: |dL/d log-probs| over the minibatch (float64)."""


class NonFiniteError(RuntimeError):
    """A loss, its gradient or an optimizer value was NaN/inf; the arm stopped at that update.

    `record` holds the step's metrics up to the failure (rollouts and the failing update)."""

    def __init__(self, message: str, *, record: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.record: dict[str, Any] = dict(record or {})


_ADAM_DEFAULT = (
    tinker.AdamParams()
)  # the one source of Adam defaults (plan.ADAM_DEFAULTS mirrors it)


@dataclass(frozen=True)
class ArmConfig:
    """One training arm. Two paired arms differ only in `loss_fn` / `loss_name`.

    Args:
        name: arm name as in the plan (`grpo_seed0`).
        loss_fn: Tinker custom loss `(data, logprobs_list) -> (loss, metrics)`, e.g.
            `losslab.losses.as_tinker_loss_fn(get_loss(...))`; its metrics are logged per update.
        loss_name: the loss's name, a label for the metrics rows and messages only (nothing
            branches on it).
        seed: derives every sampling seed together with the step index.
        learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm: `tinker.AdamParams` of
            every `optim_step`; the defaults are `tinker.AdamParams()`'s (eps 1e-12 in tinker
            0.38.0; the cookbook's recipes set 1e-8 explicitly), so a default here is the
            service's default.
        group_size: completions per prompt (G).
        groups_per_batch: prompts per step (P); the step's problems are the task's batch
            `step % ceil(N/P)` (`losslab.tasks.batch_for_step`, the cookbook's cursor).
        temperature, max_tokens: sampling settings.
        updates_per_batch: minibatches per batch, one `optim_step` each. 1 is on-policy and
            leaves nothing for a clip or trust region to act on.
        remove_constant_reward_groups: drop groups whose rewards are all equal (zero advantage)
            before training; the count is logged. When every group is constant the first one is
            kept, as in the cookbook. Off by default as in the cookbook.
        (A batch with fewer datums than `updates_per_batch` runs one update per datum, as the
        cookbook's `train_step` does; `optim/steps_executed` records how many ran.)
        side_losses: losses evaluated on the same datums and current log-probs without
            stepping (e.g. `{"baseline": grpo}` on the treatment arm for the activation gate);
            their metrics are logged as `update{u}/<name>/<key>`.
    """

    name: str
    loss_fn: CustomLossFn
    loss_name: str
    seed: int = 0
    learning_rate: float = _ADAM_DEFAULT.learning_rate
    beta1: float = _ADAM_DEFAULT.beta1
    beta2: float = _ADAM_DEFAULT.beta2
    eps: float = _ADAM_DEFAULT.eps
    weight_decay: float = _ADAM_DEFAULT.weight_decay
    grad_clip_norm: float = _ADAM_DEFAULT.grad_clip_norm
    group_size: int = 8
    groups_per_batch: int = 8
    temperature: float = 1.0
    max_tokens: int = 32
    updates_per_batch: int = 2
    remove_constant_reward_groups: bool = False
    side_losses: Mapping[str, CustomLossFn] = field(default_factory=dict)
    builtin: tuple[str, Mapping[str, float]] | None = None
    """`(loss_fn, loss_fn_config)` of the backend built-in that trains the arm instead of
    `loss_fn` (`engine.loss_path: builtin`, `losses.tinker_builtins.builtin_request`); `loss_fn`
    then computes the arm's metrics on the log-probs the backend returns."""

    def __post_init__(self) -> None:
        for key in ("group_size", "groups_per_batch", "max_tokens", "updates_per_batch"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ArmConfig {self.name!r}: {key} must be an integer >= 1, got {value!r}"
                )
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(
                f"ArmConfig {self.name!r}: learning_rate must be > 0, got {self.learning_rate!r}"
            )
        if not self.temperature >= 0:
            raise ValueError(
                f"ArmConfig {self.name!r}: temperature must be >= 0, got {self.temperature!r}"
            )
        if self.group_size * self.groups_per_batch < self.updates_per_batch:
            raise ValueError(
                f"ArmConfig {self.name!r}: {self.groups_per_batch} x {self.group_size} datums cannot "
                f"fill {self.updates_per_batch} minibatches"
            )

    def adam_params(self) -> tinker.AdamParams:
        return tinker.AdamParams(
            learning_rate=self.learning_rate,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )


def resolve(value: Any) -> Any:
    """The value of a Tinker future (`.result()`), or the value itself when it is not one."""
    return value.result() if hasattr(value, "result") else value


def sampling_seed(seed: int, step: int, group: int) -> int:
    """Sampling seed of one prompt's group at one step: a pure function of (seed, step, group)."""
    return int(
        np.random.SeedSequence([int(seed), int(step), int(group)]).generate_state(1)[0] & 0x7FFFFFFF
    )


def renderer_for(training_client: Any) -> ChatRenderer:
    """The chat renderer for a training client's model (its tokenizer and base-model name)."""
    info = training_client.get_info()
    model_name = getattr(getattr(info, "model_data", None), "model_name", None) or getattr(
        info, "model_name", ""
    )
    return ChatRenderer(training_client.get_tokenizer(), model_name=str(model_name or ""))


# ----------------------------------------------------------------------------- one update


def _masked(datum: tinker.Datum, key: str) -> torch.Tensor:
    return datum.loss_fn_inputs[key].to_torch().to(torch.float32).reshape(-1)


def _quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.to(torch.float64), q)) if x.numel() else 0.0


def policy_stats(
    data: Sequence[tinker.Datum], logprobs_list: Sequence[torch.Tensor]
) -> dict[str, float]:
    """The engine's cross-loss diagnostics: the current policy against the sampler.

    Every loss is measured the same way here, whatever its own anchor, so the keys live in the
    engine's namespaces and never overwrite a loss's metrics (a loss's `ratio/*`, `drift/*`
    are against its anchor, e.g. recomputed old log-probs):

    - `policy/drift_vs_sampler_{mean,q50,q90,max}`: |p - q| over loss-mask tokens, with
      p = exp(current log-prob), q = exp(sampler log-prob);
    - `policy/ratio_vs_sampler_{mean,q10,q50,q90,max}`: r = p / q;
    - `gap/*`: trainer-vs-sampler log-prob gap (`gap/kl_sample_train_v1` = mean(log q - log p),
      `_v2` = 0.5 mean((log q - log p)^2), as the cookbook's `optim/kl_sample_train_v1/v2`;
      `gap/abs_logprob_{mean,max}` of |log q - log p|; `gap/logprob_pearson`, their Pearson
      correlation over loss tokens (verl's mismatch metric); `gap/abs_logprob_mean_shift_
      {minus1,plus1}`, the mean |Δ| with the sampler's log-probs one position early / late:
      the pilot's alignment check wants the trained positions' gap below both);
    - `tokens/loss`: loss-mask tokens in the minibatch.
    """
    lp_parts, q_parts = [], []
    shifted: dict[int, list[torch.Tensor]] = {-1: [], 1: []}
    for datum, lp in zip(data, logprobs_list, strict=True):
        mask = _masked(datum, "mask") > 0
        lp_N, q_N = lp.detach().reshape(-1).to(torch.float64), _masked(datum, "logprobs")
        q_N = q_N.to(torch.float64)
        lp_parts.append(lp_N[mask])
        q_parts.append(q_N[mask])
        for offset, parts in shifted.items():
            parts.append(_shifted_abs_gap(lp_N, q_N, mask, offset))
    lp_T, q_T = torch.cat(lp_parts), torch.cat(q_parts)  # (T,) over all loss tokens
    if lp_T.numel() == 0:
        return {"tokens/loss": 0.0}
    abs_dp_T = (lp_T.exp() - q_T.exp()).abs()
    ratio_T = (lp_T - q_T).exp()
    diff_T = q_T - lp_T
    alignment = {}
    for offset, name in ((-1, "minus1"), (1, "plus1")):
        gaps_M = torch.cat(shifted[offset])  # (M,) loss-token pairs one position apart
        if gaps_M.numel():
            alignment[f"gap/abs_logprob_mean_shift_{name}"] = float(gaps_M.mean())
    pearson = _pearson(lp_T, q_T)
    if pearson is not None:
        alignment["gap/logprob_pearson"] = pearson
    return {
        "tokens/loss": float(lp_T.numel()),
        "policy/drift_vs_sampler_mean": float(abs_dp_T.mean()),
        "policy/drift_vs_sampler_q50": _quantile(abs_dp_T, 0.5),
        "policy/drift_vs_sampler_q90": _quantile(abs_dp_T, 0.9),
        "policy/drift_vs_sampler_max": float(abs_dp_T.max()),
        "policy/ratio_vs_sampler_mean": float(ratio_T.mean()),
        "policy/ratio_vs_sampler_q10": _quantile(ratio_T, 0.1),
        "policy/ratio_vs_sampler_q50": _quantile(ratio_T, 0.5),
        "policy/ratio_vs_sampler_q90": _quantile(ratio_T, 0.9),
        "policy/ratio_vs_sampler_max": float(ratio_T.max()),
        "gap/abs_logprob_mean": float(diff_T.abs().mean()),
        "gap/abs_logprob_max": float(diff_T.abs().max()),
        "gap/kl_sample_train_v1": float(diff_T.mean()),
        "gap/kl_sample_train_v2": float(0.5 * (diff_T**2).mean()),
        **alignment,
    }


def _shifted_abs_gap(
    lp_N: torch.Tensor, q_N: torch.Tensor, mask_N: torch.Tensor, offset: int
) -> torch.Tensor:
    """|log p_t - log q_(t+offset)| at loss positions t whose neighbour t+offset is a loss
    position too: the sampler-vs-trainer gap if the two were one position out of step."""
    if offset == 1:
        both_N = mask_N[:-1] & mask_N[1:]
        return (lp_N[:-1] - q_N[1:])[both_N].abs()
    if offset == -1:
        both_N = mask_N[1:] & mask_N[:-1]
        return (lp_N[1:] - q_N[:-1])[both_N].abs()
    raise ValueError(f"offset must be -1 or 1, got {offset}")


def _pearson(x_T: torch.Tensor, y_T: torch.Tensor) -> float | None:
    """Pearson correlation of two float64 vectors (verl's sampler/trainer log-prob correlation);
    None with fewer than 2 values or a constant one (undefined)."""
    if x_T.numel() < 2:
        return None
    dx_T, dy_T = x_T - x_T.mean(), y_T - y_T.mean()
    denom = float(torch.sqrt((dx_T**2).sum() * (dy_T**2).sum()))
    if denom == 0.0 or not math.isfinite(denom):
        return None
    return float((dx_T * dy_T).sum()) / denom


def _instrumented(arm: ArmConfig, record: dict[str, float]) -> CustomLossFn:
    """Wrap the arm's loss: record its metrics as it reports them, the side losses, the engine's
    policy diagnostics, the loss the update backpropagates and the gradient norm."""

    def loss_fn(
        data: list[tinker.Datum], logprobs_list: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = arm.loss_fn(data, logprobs_list)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise ValueError(
                f"arm {arm.name!r}: loss {arm.loss_name!r} returned {type(loss).__name__} without "
                "a gradient path to the log-probs; a custom loss must be differentiable"
            )
        record.update({k: float(v) for k, v in metrics.items()})
        record[TRAINED_LOSS] = float(loss.detach().sum())
        for side_name, side_fn in arm.side_losses.items():
            detached = [lp.detach().clone().requires_grad_(True) for lp in logprobs_list]
            side_loss, side_metrics = side_fn(data, detached)
            record.update({f"{side_name}/{k}": float(v) for k, v in side_metrics.items()})
            record[f"{side_name}/{TRAINED_LOSS}"] = float(side_loss.detach().sum())
        record.update(policy_stats(data, logprobs_list))
        grads = torch.autograd.grad(loss.sum(), logprobs_list, retain_graph=True, allow_unused=True)
        sq = sum(float((g.to(torch.float64) ** 2).sum()) for g in grads if g is not None)
        record[GRAD_NORM] = math.sqrt(sq) if math.isfinite(sq) else float("nan")
        return loss, metrics

    return loss_fn


# ----------------------------------------------------------------------------- the stages


def sample_groups(
    training_client: TrainingClient,
    renderer: ChatRenderer,
    task: Task,
    problems_P: Sequence[Problem],
    arm: ArmConfig,
    step: int,
) -> tuple[list[Rollout], dict[str, Any]]:
    """Stage 1: snapshot the sampler, sample G completions per problem and grade them."""
    out: dict[str, Any] = {}
    t = time.perf_counter()
    sampler = resolve(training_client.save_weights_and_get_sampling_client())
    out["time/snapshot_s"] = time.perf_counter() - t
    t = time.perf_counter()
    prompts_P = [renderer.build_prompt(task.messages(p)) for p in problems_P]
    seeds_P = [sampling_seed(arm.seed, step, g) for g in range(len(problems_P))]
    # Submit every group before reading any result, so a batching backend generates them together.
    futures_P = [
        sampler.sample(
            prompt=prompt,
            num_samples=arm.group_size,
            sampling_params=tinker.SamplingParams(
                max_tokens=arm.max_tokens,
                temperature=arm.temperature,
                seed=seed,
                stop=list(renderer.stop_token_ids),
            ),
        )
        for prompt, seed in zip(prompts_P, seeds_P, strict=True)
    ]
    rollouts = []
    for g, (problem, prompt, future) in enumerate(
        zip(problems_P, prompts_P, futures_P, strict=True)
    ):
        response = resolve(future)
        if len(response.sequences) != arm.group_size:
            raise RuntimeError(
                f"sampler returned {len(response.sequences)} sequences for num_samples={arm.group_size}"
            )
        for seq in response.sequences:
            tokens = [int(t) for t in seq.tokens]
            if seq.logprobs is None or len(seq.logprobs) != len(tokens):
                raise RuntimeError("sampler did not return one log-prob per sampled token")
            text, stopped = renderer.parse(tokens)
            grade = task.grade(problem, text, stopped)
            rollouts.append(
                Rollout(
                    group=g,
                    problem_id=problem.id,
                    prompt_tokens=prompt.to_ints(),
                    tokens=tokens,
                    sampler_logprobs=[float(x) for x in seq.logprobs],
                    reward=grade.reward,
                    correct=grade.correct,
                    format=grade.format,
                    stopped=stopped,
                )
            )
    out["time/sample_s"] = time.perf_counter() - t
    out.update(_rollout_metrics(rollouts, len(problems_P)))
    out["data/problem_ids"] = [p.id for p in problems_P]
    out["data/sampling_seeds"] = seeds_P
    out["data/group_size"] = float(arm.group_size)  # the planned G, beside the effective one
    out["seed/arm"] = int(arm.seed)  # every sampling seed derives from it (sampling_seed)
    return rollouts, out


def group_diversity(rollouts: Sequence[Rollout], n_groups: int) -> dict[str, float]:
    """Token-identical completions per group and the effective group size (distinct completions
    in a group): a sampler that ignores its seed or returns one sequence `num_samples` times
    (tinker-feedback #79) shrinks the GRPO group without an error, so every step logs it.

    - `data/duplicate_completions`: completions that repeat an earlier one of their group;
    - `data/effective_group_size_{mean,min}`: distinct completions per group;
    - `data/groups_all_identical`: groups of more than one completion that are all one sequence.
    """
    distinct_P, sizes_P = [], []
    for g in range(n_groups):
        group = [tuple(r.tokens) for r in rollouts if r.group == g]
        distinct_P.append(len(set(group)))
        sizes_P.append(len(group))
    return {
        "data/duplicate_completions": float(sum(sizes_P) - sum(distinct_P)),
        "data/effective_group_size_mean": sum(distinct_P) / n_groups,
        "data/effective_group_size_min": float(min(distinct_P)),
        "data/groups_all_identical": float(
            sum(d == 1 and n > 1 for d, n in zip(distinct_P, sizes_P, strict=True))
        ),
    }


def _rollout_metrics(rollouts: Sequence[Rollout], n_groups: int) -> dict[str, float]:
    rewards_P_G = [[r.reward for r in rollouts if r.group == g] for g in range(n_groups)]
    constant = [max(rs) == min(rs) for rs in rewards_P_G]
    correct_P_G = [[r.correct for r in rollouts if r.group == g] for g in range(n_groups)]
    n = len(rollouts)
    return {
        "reward/mean": sum(r.reward for r in rollouts) / n,
        "reward/correct": sum(r.correct for r in rollouts) / n,
        "reward/format": sum(r.format for r in rollouts) / n,
        "reward/frac_mixed": sum(not c for c in constant) / n_groups,
        "reward/frac_all_good": sum(all(c) for c in correct_P_G) / n_groups,
        "reward/frac_all_bad": sum(not any(c) for c in correct_P_G) / n_groups,
        "tokens/prompt_mean": sum(len(r.prompt_tokens) for r in rollouts) / n,
        "tokens/completion_mean": sum(len(r.tokens) for r in rollouts) / n,
        "tokens/completion_total": float(sum(len(r.tokens) for r in rollouts)),
        "tokens/truncated_frac": sum(not r.stopped for r in rollouts) / n,
        **group_diversity(rollouts, n_groups),
    }


def assemble_datums(
    rollouts: Sequence[Rollout], n_groups: int, arm: ArmConfig
) -> tuple[list[tinker.Datum], dict[str, Any]]:
    """Stage 2: centre rewards per group (GRPO) and build one cookbook datum per rollout."""
    t = time.perf_counter()
    datums_D: list[tinker.Datum] = []
    groups_P = [[r for r in rollouts if r.group == g] for g in range(n_groups)]
    kept = range(n_groups)
    if arm.remove_constant_reward_groups:  # the cookbook keeps one group when all are constant
        kept = keep_varied_groups([[r.reward for r in group] for group in groups_P])
    for g in kept:
        group = groups_P[g]
        rewards_G = torch.tensor([r.reward for r in group], dtype=torch.float64)
        advantages_G = group_advantages(rewards_G)
        datums_D += [
            build_datum(r.prompt_tokens, r.tokens, r.sampler_logprobs, float(a))
            for r, a in zip(group, advantages_G.tolist(), strict=True)
        ]
    out = {
        "reward/groups_dropped": float(n_groups - len(kept)),
        "data/datums": float(len(datums_D)),
        "time/datums_s": time.perf_counter() - t,
    }
    return datums_D, out


def _check_finite(record: Mapping[str, float], keys: Sequence[str], where: str) -> None:
    """The one NaN policy: a non-finite loss, gradient, backend or optimizer value stops the arm.

    Raised before the update's `optim_step` for the loss and gradient, after it for what the
    optimizer reports; the step's metrics so far travel on the error (`NonFiniteError.record`).
    """
    bad = [k for k in keys if not math.isfinite(record.get(k, float("nan")))]
    if bad:
        raise NonFiniteError(
            f"{where}: " + ", ".join(f"{k}={record.get(k)}" for k in bad) + " is not finite",
            record=dict(record),
        )


def train_on_minibatches(
    training_client: TrainingClient, datums_D: Sequence[tinker.Datum], arm: ArmConfig, step: int
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Stage 3: for each of `updates_per_batch` minibatches, `forward_backward_custom(arm loss)`
    then one `optim_step`. As the cookbook's `train_step`, a batch with fewer datums than
    minibatches runs one update per datum (none for an empty batch). Returns one record per
    executed update and the stage's `time/*` totals (kept out of the records: everything but
    `time/*` is reproducible)."""
    per_update: list[dict[str, float]] = []
    times = {"time/forward_backward_s": 0.0, "time/optim_s": 0.0}
    if not datums_D:
        return per_update, times
    n_updates = min(arm.updates_per_batch, len(datums_D))
    for u, minibatch_D in enumerate(split_minibatches(list(datums_D), n_updates), 1):
        where = f"arm {arm.name!r} step {step} update {u}"
        record: dict[str, float] = {"datums": float(len(minibatch_D))}
        t = time.perf_counter()
        if arm.builtin is None:
            result = resolve(
                training_client.forward_backward_custom(minibatch_D, _instrumented(arm, record))
            )
        else:
            result = _builtin_update(training_client, minibatch_D, arm, record)
        times["time/forward_backward_s"] += time.perf_counter() - t
        _check_finite(record, (TRAINED_LOSS, GRAD_NORM), where + " (stopped before optim_step)")
        # Tinker-style "name:reduction" keys only (loss:sum, surrogate_loss:sum); the user
        # metrics the backend echoes are already in the record.
        backend = getattr(result, "metrics", None) or {}
        record.update({f"backend/{k}": float(v) for k, v in backend.items() if ":" in k})
        t = time.perf_counter()
        response = resolve(training_client.optim_step(arm.adam_params()))
        times["time/optim_s"] += time.perf_counter() - t
        optim_metrics = getattr(response, "metrics", None) or {}
        record.update({f"optim/{k}": float(v) for k, v in optim_metrics.items()})
        reported = sorted(k for k in record if k.startswith(("optim/", "backend/")))
        _check_finite(record, reported, where + " (after optim_step)")
        per_update.append(record)
    return per_update, times


def _builtin_update(
    training_client: TrainingClient,
    minibatch_D: list[tinker.Datum],
    arm: ArmConfig,
    record: dict[str, float],
) -> Any:
    """One `forward_backward` with the arm's backend built-in; the arm's loss object then runs
    on the log-probs the backend returned (no gradient reaches the backend from it), so the
    record has the same keys as on the custom path."""
    assert arm.builtin is not None
    loss_fn, config = arm.builtin
    result = resolve(training_client.forward_backward(minibatch_D, loss_fn, dict(config)))
    logprobs_D = [
        o["logprobs"].to_torch().to(torch.float32).reshape(-1).requires_grad_(True)
        for o in result.loss_fn_outputs
    ]
    _instrumented(arm, record)(minibatch_D, logprobs_D)
    return result


STEP_MEANS = (
    "loss/clip_fraction",
    "dppo/mask_fraction",
    "drift/abs_p_q90",
    "policy/drift_vs_sampler_q90",
)
"""Per-update keys whose mean over the step's updates is also logged at the step level (when
every update has them)."""


def summarise(per_update: Sequence[Mapping[str, float]], arm: ArmConfig) -> dict[str, Any]:
    """Stage 4: the step's update records under `update{u}/` plus the step-level totals."""
    out: dict[str, Any] = {}
    for u, record in enumerate(per_update, start=1):
        out.update({f"update{u}/{k}": v for k, v in record.items()})
    out["optim/steps_executed"] = float(len(per_update))
    out["optim/lr"] = arm.learning_rate
    if per_update:
        out["loss/value"] = sum(r[TRAINED_LOSS] for r in per_update)
        for key in STEP_MEANS:
            if all(key in r for r in per_update):
                out[key] = sum(r[key] for r in per_update) / len(per_update)
        for key in ("gap/abs_logprob_mean", "gap/abs_logprob_max", "gap/kl_sample_train_v1"):
            if key in per_update[0]:
                out[f"{key}_first_update"] = per_update[0][key]
    return out


# ----------------------------------------------------------------------------- one RL step


def rl_step(
    training_client: TrainingClient,
    task: Task,
    problems_P: Sequence[Problem],
    arm: ArmConfig,
    step: int,
    *,
    renderer: ChatRenderer | None = None,
) -> dict[str, Any]:
    """One RL step of one arm, as cookbook `rl/train.py`: sample groups -> assemble datums ->
    train on minibatches -> summarise. Returns the step's metrics (docs/interfaces.md, engine).

    Raises NonFiniteError (before that update's optim_step) when the loss or its gradient is
    not finite; the partial record is on the error, with this step's rollout metrics.
    """
    renderer = renderer or renderer_for(training_client)
    out: dict[str, Any] = {"step": step, "arm": arm.name, "loss_name": arm.loss_name}
    t_step = time.perf_counter()
    rollouts, sampled = sample_groups(training_client, renderer, task, problems_P, arm, step)
    out.update(sampled)
    datums_D, assembled = assemble_datums(rollouts, len(problems_P), arm)
    out.update(assembled)
    try:
        per_update, times = train_on_minibatches(training_client, datums_D, arm, step)
    except NonFiniteError as e:
        e.record = {**out, **e.record}
        raise
    out.update(summarise(per_update, arm))
    out.update(times)
    out["time/step_s"] = time.perf_counter() - t_step
    return out


# ----------------------------------------------------------------------------- the arm loop


class ArmLoop:
    """One arm on a training client: `step(i)` is `rl_step` on the rows of step i.

    The data cursor is the step index (rows `[i*P, (i+1)*P)` of the task's training order, every
    sampling seed derived from (seed, step, group)), so the client's weights and optimizer state
    plus `next_step` are the whole state. The runner wraps one per arm (adding checkpoints);
    tests drive the same object through `train_steps`.
    """

    def __init__(
        self,
        training_client: TrainingClient,
        task: Task,
        arm: ArmConfig,
        *,
        renderer: ChatRenderer | None = None,
        next_step: int = 0,
    ) -> None:
        self.client, self.task, self.arm = training_client, task, arm
        self.renderer = renderer or renderer_for(training_client)
        self.next_step = next_step

    def step(self, step: int) -> dict[str, Any]:
        if step != self.next_step:
            raise ValueError(
                f"arm {self.arm.name!r}: asked for step {step}, the state is at {self.next_step}"
            )
        problems_P = batch_for_step(self.task.train, step, self.arm.groups_per_batch)
        row = rl_step(self.client, self.task, problems_P, self.arm, step, renderer=self.renderer)
        self.next_step = step + 1
        return row


class Steps(Protocol):
    """Anything with `step(i) -> metrics` (an `ArmLoop`, the runner's trainers, test fakes)."""

    def step(self, step: int) -> dict[str, Any]: ...


def train_steps(
    trainer: Steps, start_step: int, until: int, *, arm: str | None = None
) -> Iterator[dict[str, Any]]:
    """The arm loop: yield the metrics row of each step `start_step .. until-1`.

    The one loop the runner and the tests drive. The caller persists each row (the runner
    checkpoints and writes metrics.jsonl after every yield, before the next step runs). Rows get
    `step`, `arm` (when given) and `time/step_s` (wall time of the whole step). A
    NonFiniteError propagates: earlier rows were already yielded, the failing step yields none.
    """
    if not 0 <= start_step <= until:
        raise ValueError(f"start_step must be in [0, until={until}], got {start_step}")
    for i in range(start_step, until):
        t0 = time.perf_counter()
        row = dict(trainer.step(i))
        row["step"] = i
        if arm is not None:
            row["arm"] = arm
        row["time/step_s"] = time.perf_counter() - t0
        yield row

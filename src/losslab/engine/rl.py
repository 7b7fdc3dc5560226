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

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tinker
import torch

from losslab.atomic import atomic_write_text
from losslab.engine.datums import (
    Rollout,
    build_datum,
    group_advantages,
    keep_varied_groups,
    split_minibatches,
)
from losslab.tasks.base import ChatRenderer, Problem, Task, batch_for_step

__all__ = [
    "ArmConfig",
    "CustomLossFn",
    "MetricsLog",
    "NonFiniteError",
    "policy_stats",
    "renderer_for",
    "resolve",
    "rl_step",
    "sampling_seed",
    "train_arm",
]

CustomLossFn = Callable[
    [list[tinker.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]
]


class NonFiniteError(RuntimeError):
    """A loss or its gradient was NaN/inf; the arm stopped before applying that update."""


@dataclass(frozen=True)
class ArmConfig:
    """One training arm. Two paired arms differ only in `loss_fn` / `loss_name`.

    Args:
        name: arm name as in the plan (`grpo_seed0`).
        loss_fn: Tinker custom loss `(data, logprobs_list) -> (loss, metrics)`, e.g.
            `losslab.losses.as_tinker_loss_fn(get_loss(...))`; its metrics are logged per update.
        loss_name: registry name of the loss; a name starting with `dppo` also logs its
            `loss/clip_fraction` as `dppo/mask_fraction`.
        seed: derives every sampling seed together with the step index.
        learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm: `tinker.AdamParams` of
            every `optim_step` (cookbook: beta1 0.9, beta2 0.95, eps 1e-8).
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
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    group_size: int = 8
    groups_per_batch: int = 8
    temperature: float = 1.0
    max_tokens: int = 32
    updates_per_batch: int = 2
    remove_constant_reward_groups: bool = False
    side_losses: Mapping[str, CustomLossFn] = field(default_factory=dict)

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


# ----------------------------------------------------------------------------- metrics file


class MetricsLog:
    """`metrics.jsonl`: one JSON object per step, rewritten atomically on every append."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [
            json.loads(line)
            for line in self.path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]

    def _write(self, records: list[dict[str, Any]]) -> None:
        atomic_write_text(self.path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in records))

    def append(self, record: dict[str, Any]) -> None:
        self._write([*self.read(), record])

    def truncate_from(self, step: int) -> None:
        """Drop records of steps >= `step` (a resumed arm rewrites them)."""
        if self.path.is_file():
            self._write([r for r in self.read() if int(r.get("step", -1)) < step])


# ----------------------------------------------------------------------------- one update


def _masked(datum: tinker.Datum, key: str) -> torch.Tensor:
    return datum.loss_fn_inputs[key].to_torch().to(torch.float32).reshape(-1)


def _quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x.to(torch.float64), q)) if x.numel() else 0.0


def policy_stats(
    data: Sequence[tinker.Datum], logprobs_list: Sequence[torch.Tensor]
) -> dict[str, float]:
    """Drift of the current policy from the sampler over loss-mask tokens.

    `drift/abs_p_*` = quantiles of |p - q| with p = exp(current log-prob), q = exp(sampler
    log-prob); `ratio/*` = statistics of r = p / q; `gap/*` = trainer-vs-sampler log-prob gap
    (`gap/kl_sample_train_v1` = mean(log q - log p), `_v2` = 0.5 mean((log q - log p)^2), as the
    cookbook's `optim/kl_sample_train_v1/v2`).
    """
    lp_parts, q_parts = [], []
    for datum, lp in zip(data, logprobs_list, strict=True):
        mask = _masked(datum, "mask") > 0
        lp_parts.append(lp.detach().reshape(-1).to(torch.float64)[mask])
        q_parts.append(_masked(datum, "logprobs").to(torch.float64)[mask])
    lp_T, q_T = torch.cat(lp_parts), torch.cat(q_parts)  # (T,) over all loss tokens
    if lp_T.numel() == 0:
        return {"tokens/loss": 0.0}
    abs_dp_T = (lp_T.exp() - q_T.exp()).abs()
    ratio_T = (lp_T - q_T).exp()
    diff_T = q_T - lp_T
    return {
        "tokens/loss": float(lp_T.numel()),
        "drift/abs_p_mean": float(abs_dp_T.mean()),
        "drift/abs_p_q50": _quantile(abs_dp_T, 0.5),
        "drift/abs_p_q90": _quantile(abs_dp_T, 0.9),
        "drift/abs_p_max": float(abs_dp_T.max()),
        "ratio/mean": float(ratio_T.mean()),
        "ratio/q10": _quantile(ratio_T, 0.1),
        "ratio/q50": _quantile(ratio_T, 0.5),
        "ratio/q90": _quantile(ratio_T, 0.9),
        "ratio/max": float(ratio_T.max()),
        "gap/abs_logprob_mean": float(diff_T.abs().mean()),
        "gap/abs_logprob_max": float(diff_T.abs().max()),
        "gap/kl_sample_train_v1": float(diff_T.mean()),
        "gap/kl_sample_train_v2": float(0.5 * (diff_T**2).mean()),
    }


def _instrumented(arm: ArmConfig, record: dict[str, float]) -> CustomLossFn:
    """Wrap the arm's loss: record its metrics, the side losses, drift and the gradient check."""

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
        record["loss/value"] = float(loss.detach().sum())
        for side_name, side_fn in arm.side_losses.items():
            detached = [lp.detach().clone().requires_grad_(True) for lp in logprobs_list]
            side_loss, side_metrics = side_fn(data, detached)
            record.update({f"{side_name}/{k}": float(v) for k, v in side_metrics.items()})
            record[f"{side_name}/loss/value"] = float(side_loss.detach().sum())
        record.update(policy_stats(data, logprobs_list))
        grads = torch.autograd.grad(loss.sum(), logprobs_list, retain_graph=True, allow_unused=True)
        sq = sum(float((g.to(torch.float64) ** 2).sum()) for g in grads if g is not None)
        record["grad/logprob_norm"] = math.sqrt(sq) if math.isfinite(sq) else float("nan")
        return loss, metrics

    return loss_fn


# ----------------------------------------------------------------------------- one RL step


def _sample_groups(
    sampler: Any,
    renderer: ChatRenderer,
    task: Task,
    problems_P: Sequence[Problem],
    arm: ArmConfig,
    step: int,
) -> list[Rollout]:
    prompts_P = [renderer.build_prompt(task.messages(p)) for p in problems_P]
    # Submit every group before reading any result, so a batching backend generates them together.
    futures_P = [
        sampler.sample(
            prompt=prompt,
            num_samples=arm.group_size,
            sampling_params=tinker.SamplingParams(
                max_tokens=arm.max_tokens,
                temperature=arm.temperature,
                seed=sampling_seed(arm.seed, step, g),
                stop=list(renderer.stop_token_ids),
            ),
        )
        for g, prompt in enumerate(prompts_P)
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
    return rollouts


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
    }


def rl_step(
    training_client: Any,
    task: Task,
    problems_P: Sequence[Problem],
    arm: ArmConfig,
    step: int,
    *,
    renderer: ChatRenderer | None = None,
) -> dict[str, Any]:
    """One RL step of one arm; returns the step's metrics (see docs/interfaces.md, engine).

    Snapshot the sampler, sample G completions for each of the P problems, grade them, centre
    rewards per group, build cookbook datums, then for each of `updates_per_batch` minibatches
    run `forward_backward_custom(arm loss)` and `optim_step`. Raises NonFiniteError (before that
    update's optim_step) when the loss or its gradient is not finite.
    """
    renderer = renderer or renderer_for(training_client)
    out: dict[str, Any] = {"step": step, "arm": arm.name, "loss_name": arm.loss_name}
    t_step = time.perf_counter()

    t = time.perf_counter()
    sampler = resolve(training_client.save_weights_and_get_sampling_client())
    out["time/snapshot_s"] = time.perf_counter() - t

    t = time.perf_counter()
    rollouts = _sample_groups(sampler, renderer, task, problems_P, arm, step)
    out["time/sample_s"] = time.perf_counter() - t
    out.update(_rollout_metrics(rollouts, len(problems_P)))
    out["data/problem_ids"] = [p.id for p in problems_P]
    out["data/sampling_seeds"] = [sampling_seed(arm.seed, step, g) for g in range(len(problems_P))]

    t = time.perf_counter()
    datums: list[tinker.Datum] = []
    groups_P = [[r for r in rollouts if r.group == g] for g in range(len(problems_P))]
    kept = range(len(groups_P))
    if arm.remove_constant_reward_groups:
        kept = keep_varied_groups([[r.reward for r in group] for group in groups_P])
    for g in kept:
        group = groups_P[g]
        rewards_G = torch.tensor([r.reward for r in group], dtype=torch.float64)
        advantages_G = group_advantages(rewards_G)
        datums += [
            build_datum(r.prompt_tokens, r.tokens, r.sampler_logprobs, float(a))
            for r, a in zip(group, advantages_G.tolist(), strict=True)
        ]
    out["reward/groups_dropped"] = float(len(groups_P) - len(kept))
    out["data/datums"] = float(len(datums))
    out["time/datums_s"] = time.perf_counter() - t

    executed, fb_s, opt_s = 0, 0.0, 0.0
    per_update: list[dict[str, float]] = []
    if datums:  # cookbook `train_step`: at most one minibatch per datum
        n_updates = min(arm.updates_per_batch, len(datums))
        for u, minibatch_D in enumerate(split_minibatches(datums, n_updates), start=1):
            record: dict[str, float] = {"datums": float(len(minibatch_D))}
            t = time.perf_counter()
            result = resolve(
                training_client.forward_backward_custom(minibatch_D, _instrumented(arm, record))
            )
            fb_s += time.perf_counter() - t
            bad = [
                k
                for k in ("loss/value", "grad/logprob_norm")
                if not math.isfinite(record.get(k, float("nan")))
            ]
            if bad:
                out.update({f"update{u}/{k}": v for k, v in record.items()})
                raise NonFiniteError(
                    f"arm {arm.name!r} step {step} update {u}: "
                    + ", ".join(f"{k}={record.get(k)}" for k in bad)
                    + " is not finite; stopped before optim_step (earlier steps are kept)"
                )
            # Tinker-style "name:reduction" keys only (loss:sum, surrogate_loss:sum); the user
            # metrics the backend echoes are already in the record.
            backend = getattr(result, "metrics", None) or {}
            record.update({f"backend/{k}": float(v) for k, v in backend.items() if ":" in k})
            t = time.perf_counter()
            response = resolve(training_client.optim_step(arm.adam_params()))
            opt_s += time.perf_counter() - t
            executed += 1
            optim_metrics = getattr(response, "metrics", None) or {}
            record.update({f"optim/{k}": float(v) for k, v in optim_metrics.items()})
            nonfinite = sorted(
                k
                for k, v in record.items()
                if k.startswith(("optim/", "backend/")) and not math.isfinite(v)
            )
            if nonfinite:
                out.update({f"update{u}/{k}": v for k, v in record.items()})
                raise NonFiniteError(
                    f"arm {arm.name!r} step {step} update {u}: non-finite {nonfinite} after optim_step"
                )
            if arm.loss_name.startswith("dppo") and "loss/clip_fraction" in record:
                record.setdefault("dppo/mask_fraction", record["loss/clip_fraction"])
            per_update.append(record)
            out.update({f"update{u}/{k}": v for k, v in record.items()})
    out["optim/steps_executed"] = float(executed)
    out["optim/lr"] = arm.learning_rate
    if per_update:
        out["loss/value"] = sum(r["loss/value"] for r in per_update)
        for key in ("loss/clip_fraction", "dppo/mask_fraction", "drift/abs_p_q90"):
            if all(key in r for r in per_update):
                out[key] = sum(r[key] for r in per_update) / len(per_update)
        for key in ("gap/abs_logprob_mean", "gap/abs_logprob_max", "gap/kl_sample_train_v1"):
            if key in per_update[0]:
                out[f"{key}_first_update"] = per_update[0][key]
    out["time/forward_backward_s"] = fb_s
    out["time/optim_s"] = opt_s
    out["time/step_s"] = time.perf_counter() - t_step
    return out


def train_arm(
    training_client: Any,
    task: Task,
    arm: ArmConfig,
    steps: int,
    *,
    start_step: int = 0,
    metrics_path: str | Path | None = None,
    renderer: ChatRenderer | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the metrics of steps `start_step .. steps-1`, appending each to `metrics_path`.

    The training client must hold the state reached after `start_step` steps (fresh for 0; a
    restored checkpoint, or the same client after a pilot of `start_step` steps). Records of
    steps >= `start_step` already in the file are replaced. On a NonFiniteError the error is
    written as that step's record and re-raised.
    """
    if not 0 <= start_step <= steps:
        raise ValueError(f"start_step must be in [0, steps={steps}], got {start_step}")
    renderer = renderer or renderer_for(training_client)
    log = MetricsLog(metrics_path) if metrics_path is not None else None
    if log is not None:
        log.truncate_from(start_step)
    for step in range(start_step, steps):
        problems_P = batch_for_step(task.train, step, arm.groups_per_batch)
        try:
            metrics = rl_step(training_client, task, problems_P, arm, step, renderer=renderer)
        except NonFiniteError as e:
            if log is not None:
                log.append({"step": step, "arm": arm.name, "error": str(e)})
            raise
        if log is not None:
            log.append(metrics)
        yield metrics

"""Property checks of an arm's loss: what any correct policy loss must satisfy, whoever wrote it.

The reference comparison (`conformance.preflight.run_path`) asks "is this the paper's loss?";
these ask "does the loss behave like a loss at all?", on any object with the `LossFn` interface
(`loss(batch, *, num_tokens=None, num_sequences=None, norm_constant=None) -> LossOutput`), a
built-in or a researcher's own. Each check is named after the bug class it catches; the public
threads are in docs/properties.md.

| check | holds when | bug class |
| --- | --- | --- |
| `minibatch_invariance` | the minibatches' gradients, each called with the full batch's counts, sum to the full batch's | token-mean over micro-batch means (SkyRL #925/#1296) |
| `padding_invariance` | masked tokens appended to every datum change neither the value nor the gradient | normalising by the padded length |
| `mask_equals_removal` | masking a loss token equals deleting it | masked tokens kept in the denominator (slime #657) |
| `finite_on_stress` | value and gradient are finite on the stress fixture | an unguarded exp(ℓ − ℓ_s) |
| `on_policy_gradient` | at p = q (ratio 1) the gradient is −A·m·w, w the declared reduction's weight | the loss does nothing (mlx-lm-lora #50); per-sequence vs per-token normalisation (prime-rl #2034) |
| `reads_anchor_logprobs` | moving the sampler (and old) log-probs changes the gradient on a stale batch | the ratio silently 1 (AReaL #201) |
| `arms_differ` | the treatment's per-token gradient differs from the baseline's on a stale batch | the treatment silently the baseline (trl #7271) |

All arithmetic is float64 (the fixtures' float32 values widened), so the tolerances are
round-off, not convention: `RTOL`, `ATOL`.

A loss's reduction is its `params["reduction"]` (every built-in has one); a loss without that
parameter reduces by its declaration's `reduction` attribute when it has one, else by `sum`
(Tinker's custom-loss convention).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from losslab.checks import Check
from losslab.conformance.fixtures import Fixture, generate_fixture, stress_spec, token_tensors

__all__ = [
    "ATOL",
    "PROPERTY_CHECKS",
    "RTOL",
    "declared_reduction",
    "property_checks",
    "property_rows",
    "run_properties",
]

RTOL = 1e-7
"""Relative tolerance of every float64 comparison (round-off of sums over ~1000 tokens)."""
ATOL = 1e-10
"""Absolute tolerance (a gradient of 0 stays 0 up to this)."""
DIFFER_MIN = 1e-6
"""`arms_differ`/`reads_anchor_logprobs`: the smallest max |Δ gradient| / max |gradient| that
counts as "different" (far above float64 round-off, far below any real convention change)."""
N_MINIBATCHES = 4
PAD_TOKENS = 5
ANCHOR_SHIFT = 0.5  # nats subtracted from sampler and old log-probs on loss tokens
REMOVE_EVERY = 7  # every 7th loss token of each datum is masked / removed

LossLike = Callable[..., Any]


@dataclass(frozen=True)
class PropertyResult:
    """One property of one loss: passed, what was measured, the bound, and why."""

    name: str
    passed: bool
    measured: Any
    bound: str
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "measured": self.measured,
            "bound": self.bound,
            "note": self.note,
        }


# ----------------------------------------------------------------------------- helpers


def declared_reduction(loss: LossLike) -> str:
    """The reduction the loss declares (module docstring)."""
    params = getattr(loss, "params", None) or {}
    if "reduction" in params:
        return str(params["reduction"])
    return str(getattr(_declaration(loss), "reduction", None) or "sum")


def _declaration(loss: LossLike) -> Any:
    """The loss's registry declaration, or None (code that is not a registry loss)."""
    try:
        return getattr(loss, "declaration", None)
    except ValueError:  # a LossFn whose name is not a registry name
        return None


def _global_factor(got: np.ndarray, want: np.ndarray) -> float:
    """The least-squares s in got ≈ s·want (0 when `want` is 0): a loss that divides by a
    constant of its own matches its reduction's gradient up to this one factor."""
    denominator = float(want @ want)
    return float(got @ want) / denominator if denominator else 0.0


def _reads_policy_inputs(loss: LossLike) -> bool:
    try:
        return bool(getattr(loss, "needs_policy_inputs", True))
    except ValueError:  # a LossFn whose name is not a registry name
        return True


def _tensors(fixture: Fixture) -> dict[str, list[torch.Tensor]]:
    """The fixture as float64 per-datum tensors, current log-probs requiring grad."""
    return token_tensors(fixture, torch.float64)


def _batch(tensors: Mapping[str, list[torch.Tensor]]) -> Any:
    from losslab.losses import TokenData

    return TokenData(**{k: list(v) for k, v in tensors.items()})


def _fresh(tensors: Mapping[str, list[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    """A copy whose current log-probs are new leaves (so every evaluation has its own grad)."""
    out = {k: [x.detach().clone() for x in v] for k, v in tensors.items()}
    out["logprobs_D"] = [x.requires_grad_(True) for x in out["logprobs_D"]]
    return out


def _evaluate(
    loss: LossLike, tensors: Mapping[str, list[torch.Tensor]], **counts: float | None
) -> tuple[float, list[np.ndarray]]:
    """(value, per-datum float64 gradients w.r.t. current log-probs) of `loss` on `tensors`."""
    t = _fresh(tensors)
    out = loss(_batch(t), **{k: v for k, v in counts.items() if v is not None})
    grads = torch.autograd.grad(out.loss, t["logprobs_D"], allow_unused=True)
    grad_D = [
        np.zeros(len(x)) if g is None else g.detach().double().numpy()
        for g, x in zip(grads, t["logprobs_D"], strict=True)
    ]
    return float(out.loss.detach()), grad_D


def _loss_tokens_D(tensors: Mapping[str, list[torch.Tensor]]) -> list[int]:
    return [int((m > 0).sum()) for m in tensors["mask_D"]]


def _global_counts(loss: LossLike, tensors: Mapping[str, list[torch.Tensor]]) -> dict[str, float]:
    """The full batch's counts a minibatch is called with (as `losses.reductions` reads them)."""
    n_D = _loss_tokens_D(tensors)
    given = (getattr(loss, "params", None) or {}).get("norm_constant")
    return {
        "num_tokens": float(max(sum(n_D), 1)),
        "num_sequences": float(max(sum(1 for n in n_D if n), 1)),
        "norm_constant": float(given) if given is not None else float(max(max(n_D), 1)),
    }


def _close(a: np.ndarray, b: np.ndarray) -> tuple[bool, float]:
    """(within RTOL/ATOL, max |a − b|)."""
    if a.shape != b.shape:
        return False, float("inf")
    if a.size == 0:
        return True, 0.0
    err = float(np.max(np.abs(a - b)))
    return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL)), err


def _first_outside(a_D: list[np.ndarray], b_D: list[np.ndarray]) -> tuple[int, int] | None:
    """(datum, position) of the first element outside tolerance."""
    for d, (a, b) in enumerate(zip(a_D, b_D, strict=True)):
        bad = ~np.isclose(a, b, rtol=RTOL, atol=ATOL)
        if bad.any():
            return d, int(np.flatnonzero(bad)[0])
    return None


def _compare(
    name: str, ours: tuple[float, list[np.ndarray]], want: tuple[float, list[np.ndarray]], why: str
) -> PropertyResult:
    """Value and per-token gradient of two evaluations that must agree."""
    value_ok, value_err = _close(np.array([ours[0]]), np.array([want[0]]))
    grad_ok, grad_err = _close(np.concatenate(ours[1]), np.concatenate(want[1]))
    first = None if grad_ok else _first_outside(ours[1], want[1])
    note = "within tolerance"
    if not (value_ok and grad_ok):
        where = f"; first differing gradient at datum {first[0]} token {first[1]}" if first else ""
        note = f"{why}: value error {value_err:.3g}, gradient error {grad_err:.3g}{where}"
    return PropertyResult(
        name,
        value_ok and grad_ok,
        {"value_abs_error": value_err, "gradient_max_abs_error": grad_err},
        f"rtol {RTOL:g}, atol {ATOL:g}",
        note,
    )


# ----------------------------------------------------------------------------- the checks


def minibatch_invariance(loss: LossLike, fixture: Fixture) -> PropertyResult:
    """Split the datums into `N_MINIBATCHES` contiguous minibatches, call each with the full
    batch's counts: their gradients, concatenated, and their values, summed, equal the full
    batch's (the reduction is linear in the datums once the counts are global)."""
    tensors = _tensors(fixture)
    counts = _global_counts(loss, tensors)
    if getattr(_declaration(loss), "batch_scope", "token") == "batch":
        return _refuses_minibatches(loss, tensors, counts)
    full = _evaluate(loss, tensors, **counts)
    bounds = np.linspace(0, len(tensors["logprobs_D"]), N_MINIBATCHES + 1).astype(int)
    value, grad_D = 0.0, []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        part = {k: v[lo:hi] for k, v in tensors.items()}
        v, g = _evaluate(loss, part, **counts)
        value, grad_D = value + v, grad_D + g
    return _compare(
        "minibatch_invariance",
        (value, grad_D),
        full,
        f"{N_MINIBATCHES} minibatches with the full batch's counts do not add up to the batch "
        f"under reduction {declared_reduction(loss)!r}",
    )


def _refuses_minibatches(
    loss: LossLike, tensors: dict[str, list[torch.Tensor]], counts: dict[str, Any]
) -> PropertyResult:
    """A batch-scoped loss (M2PO, the Cov losses: a statistic of the whole batch picks the
    mask) cannot be split; it must refuse a minibatch called with the full batch's counts
    rather than silently compute another algorithm."""
    n = len(tensors["logprobs_D"])
    part = {k: v[: max(n // N_MINIBATCHES, 1)] for k, v in tensors.items()}
    try:
        _evaluate(loss, part, **counts)
    except ValueError as exc:
        return PropertyResult(
            "minibatch_invariance",
            True,
            {"refused_minibatch": True},
            "batch-scoped: refuses a minibatch",
            f"batch-scoped loss refuses a minibatch, as declared ({exc})",
        )
    return PropertyResult(
        "minibatch_invariance",
        False,
        {"refused_minibatch": False},
        "batch-scoped: refuses a minibatch",
        "declared batch-scoped but computed a minibatch with the full batch's counts: a "
        "gradient-accumulation split would silently run another algorithm",
    )


def padding_invariance(loss: LossLike, fixture: Fixture) -> PropertyResult:
    """Append `PAD_TOKENS` masked tokens to every datum (finite garbage: log-probs −3 and −1,
    the datum's advantage carried on, as a careless pipeline pads): the value and the gradient on
    the original tokens are unchanged, and the padding gets gradient 0."""
    tensors = _tensors(fixture)
    padded: dict[str, list[torch.Tensor]] = {k: [] for k in tensors}
    fill = {"logprobs_D": -3.0, "sampler_logprobs_D": -1.0, "old_logprobs_D": -1.0, "mask_D": 0.0}
    for d in range(len(tensors["logprobs_D"])):
        for key, values in tensors.items():
            x = values[d]
            if key == "advantages_D":
                value = float(x[x != 0][0]) if bool((x != 0).any()) else 0.0
            else:
                value = fill[key]
            padded[key].append(torch.cat([x.detach(), x.new_full((PAD_TOKENS,), value)]))
    value, grad_D = _evaluate(loss, padded)
    base = _evaluate(loss, tensors)
    padding = np.concatenate([g[-PAD_TOKENS:] for g in grad_D])
    trimmed = [g[:-PAD_TOKENS] for g in grad_D]
    result = _compare(
        "padding_invariance",
        (value, trimmed),
        base,
        f"{PAD_TOKENS} masked tokens per datum changed the loss",
    )
    return _no_gradient_on(
        result, padding, "padding_gradient_max_abs", "masked padding tokens received a gradient"
    )


def mask_equals_removal(loss: LossLike, fixture: Fixture) -> PropertyResult:
    """Mask every `REMOVE_EVERY`-th loss token of each datum, or delete it: the two batches give
    the same value and the same gradient on the tokens both keep (masked ones: gradient 0)."""
    tensors = _tensors(fixture)
    masked = {k: [x.detach().clone() for x in v] for k, v in tensors.items()}
    removed: dict[str, list[torch.Tensor]] = {k: [] for k in tensors}
    keep_D = []
    for d, mask in enumerate(tensors["mask_D"]):
        on = torch.nonzero(mask > 0).flatten()
        drop = on[REMOVE_EVERY - 1 :: REMOVE_EVERY]
        keep = torch.ones(len(mask), dtype=torch.bool)
        keep[drop] = False
        keep_D.append(keep.numpy())
        masked["mask_D"][d][drop] = 0.0
        for key in tensors:
            removed[key].append(tensors[key][d].detach()[keep])
    m_value, m_grad_D = _evaluate(loss, masked)
    r = _evaluate(loss, removed)
    dropped = np.concatenate([g[~k] for g, k in zip(m_grad_D, keep_D, strict=True)])
    result = _compare(
        "mask_equals_removal",
        (m_value, [g[k] for g, k in zip(m_grad_D, keep_D, strict=True)]),
        r,
        "a masked token still counts (in the sum or in a denominator)",
    )
    return _no_gradient_on(
        result, dropped, "masked_gradient_max_abs", "a masked token received a gradient"
    )


def _no_gradient_on(
    result: PropertyResult, grad: np.ndarray, key: str, note: str
) -> PropertyResult:
    """`result`, failed with `note` (and the largest |gradient| as `key`) when it passed but
    `grad`, the gradient on tokens that must not count, exceeds `ATOL` anywhere."""
    if result.passed and np.any(np.abs(grad) > ATOL):
        measured = {**result.measured, key: float(np.max(np.abs(grad)))}
        return PropertyResult(result.name, False, measured, result.bound, note)
    return result


def finite_on_stress(loss: LossLike, stress: Fixture) -> PropertyResult:
    """Value and gradient finite on the stress fixture (|ℓ − ℓ_s| > 20, r above any cap, a fully
    masked datum, a zero-advantage datum)."""
    value, grad_D = _evaluate(loss, _tensors(stress))
    grad = np.concatenate(grad_D)
    bad = int((~np.isfinite(grad)).sum())
    ok = bool(np.isfinite(value)) and bad == 0
    first = None
    if bad:
        first = next((d, int(np.flatnonzero(~np.isfinite(g))[0])) for d, g in enumerate(grad_D)
                     if not np.isfinite(g).all())  # fmt: skip
    note = "finite" if ok else f"value {value}, {bad} non-finite gradient element(s)"
    if first:
        note += f"; first at datum {first[0]} token {first[1]}"
    return PropertyResult(
        "finite_on_stress",
        ok,
        {"value": value if np.isfinite(value) else str(value), "non_finite_gradients": bad},
        "all finite",
        note,
    )


def reduction_weights(
    reduction: str, n_D: list[int], lengths: list[int], norm_constant: float | None
) -> list[np.ndarray]:
    """Per-token weight w of each datum under `reduction` (`losses.reductions`' table): the
    gradient of a policy-gradient loss at ratio 1 is −A·m·w."""
    n_tokens = max(sum(n_D), 1)
    n_seqs = max(sum(1 for n in n_D if n), 1)
    c = float(norm_constant) if norm_constant is not None else float(max(max(n_D), 1))
    per_datum = {
        "sum": lambda n: 1.0,
        "token-mean": lambda n: 1.0 / n_tokens,
        "seq-mean-token-sum": lambda n: 1.0 / n_seqs,
        "seq-mean-token-mean": lambda n: 1.0 / (n_seqs * max(n, 1)),
        "seq-mean-token-sum-norm": lambda n: 1.0 / c,
    }
    if reduction not in per_datum:
        raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(per_datum)}")
    return [
        np.full(length, per_datum[reduction](n)) for n, length in zip(n_D, lengths, strict=True)
    ]


def on_policy_gradient(loss: LossLike, fixture: Fixture) -> PropertyResult:
    """At p = q (current = sampler = old log-probs) every clip and trust region is inactive and
    every policy loss's gradient is the policy gradient −A·m·w (w: the declared reduction's
    per-token weight); a loss that reads no policy inputs (cross-entropy) has −m·w."""
    tensors = _tensors(fixture)
    on_policy = dict(tensors)
    on_policy["logprobs_D"] = [s.detach().clone() for s in tensors["sampler_logprobs_D"]]
    on_policy["old_logprobs_D"] = [s.detach().clone() for s in tensors["sampler_logprobs_D"]]
    _, grad_D = _evaluate(loss, on_policy)
    reduction = declared_reduction(loss)
    params = getattr(loss, "params", None) or {}
    w_D = reduction_weights(
        reduction,
        _loss_tokens_D(tensors),
        [len(m) for m in tensors["mask_D"]],
        params.get("norm_constant"),
    )
    reads = _reads_policy_inputs(loss)
    declaration = _declaration(loss)
    if getattr(declaration, "sequence_ratio", False):  # GMPO: 1/|o| from the geometric mean
        w_D = [w / max(n, 1) for w, n in zip(w_D, _loss_tokens_D(tensors), strict=True)]
    want_D = [
        -(a.numpy() if reads else 1.0) * m.numpy() * w
        for a, m, w in zip(tensors["advantages_D"], tensors["mask_D"], w_D, strict=True)
    ]
    factor = 1.0
    if getattr(declaration, "constant_normaliser", False):  # Dr. GRPO's C: one global factor
        factor = _global_factor(np.concatenate(grad_D), np.concatenate(want_D))
        want_D = [w * factor for w in want_D]
    detached = 0
    if getattr(declaration, "detaches_tokens", False):  # Clip-Cov: judged on the kept tokens
        cut_D = [(g == 0) & (w != 0) for g, w in zip(grad_D, want_D, strict=True)]
        detached = int(sum(cut.sum() for cut in cut_D))
        grad_D = [np.where(cut, w, g) for cut, g, w in zip(cut_D, grad_D, want_D, strict=True)]
    ok, err = _close(np.concatenate(grad_D), np.concatenate(want_D))
    loss_tokens = int(sum(_loss_tokens_D(tensors)))
    ok = ok and factor > 0 and 2 * detached < max(loss_tokens, 1)
    first = None if ok else _first_outside(grad_D, want_D)
    what = "−A·m·w" if reads else "−m·w"
    note = "equals the on-policy policy gradient"
    if not ok:
        scale = float(np.max(np.abs(np.concatenate(want_D)))) or 1.0
        ratio = float(np.max(np.abs(np.concatenate(grad_D)))) / scale
        note = (
            f"at ratio 1 the gradient is not {what} under reduction {reduction!r} "
            f"(max |gradient| / max |{what}| = {ratio:.3g})"
        )
        if first:
            note += f"; first differing token: datum {first[0]} token {first[1]}"
    if factor != 1.0:
        note += f" (times the loss's own constant factor {factor:.4g})"
    if detached:
        note += f"; {detached} of {loss_tokens} loss tokens detached by the loss, as declared"
    return PropertyResult(
        "on_policy_gradient",
        ok,
        {
            "gradient_max_abs_error": err,
            "reduction": reduction,
            "constant_factor": factor,
            "detached_tokens": detached,
        },
        f"{what}, rtol {RTOL:g}, atol {ATOL:g}",
        note,
    )


def _relative_difference(a_D: list[np.ndarray], b_D: list[np.ndarray]) -> float:
    a, b = np.concatenate(a_D), np.concatenate(b_D)
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), ATOL)
    return float(np.max(np.abs(a - b))) / scale


def _gradients_differ(
    names: tuple[str, str], a_D: list[np.ndarray], b_D: list[np.ndarray], passed: str, failed: str
) -> PropertyResult:
    """Property `names[0]`: the relative gradient difference (measured as `names[1]`) of `a_D`
    and `b_D` exceeds `DIFFER_MIN`; `passed` is the note when it does, `failed` otherwise."""
    diff = _relative_difference(a_D, b_D)
    ok = diff > DIFFER_MIN
    name, key = names
    return PropertyResult(name, ok, {key: diff}, f"> {DIFFER_MIN:g}", passed if ok else failed)


def reads_anchor_logprobs(loss: LossLike, fixture: Fixture) -> PropertyResult | None:
    """On a stale batch, lowering the sampler and old log-probs by `ANCHOR_SHIFT` on the loss
    tokens (the ratio grows by e^0.5) changes the gradient of a loss that reads them. None for a
    loss that declares it reads no policy inputs (cross-entropy)."""
    if not _reads_policy_inputs(loss):
        return None
    tensors = _tensors(fixture)
    shifted = dict(tensors)
    for key in ("sampler_logprobs_D", "old_logprobs_D"):
        shifted[key] = [
            x.detach() - ANCHOR_SHIFT * (m > 0).to(x.dtype)
            for x, m in zip(tensors[key], tensors["mask_D"], strict=True)
        ]
    _, base_D = _evaluate(loss, tensors)
    _, moved_D = _evaluate(loss, shifted)
    return _gradients_differ(
        ("reads_anchor_logprobs", "relative_gradient_change"),
        base_D,
        moved_D,
        "the gradient follows the sampler/old log-probs",
        "moving the sampler and old log-probs left the gradient unchanged: the ratio is "
        "not taken against them (a ratio of 1 by construction)",
    )


def arms_differ(baseline: LossLike, treatment: LossLike, fixture: Fixture) -> PropertyResult:
    """The treatment's per-token gradient differs from the baseline's on the stale fixture."""
    tensors = _tensors(fixture)
    _, base_D = _evaluate(baseline, tensors)
    _, treat_D = _evaluate(treatment, tensors)
    return _gradients_differ(
        ("arms_differ", "relative_gradient_difference"),
        base_D,
        treat_D,
        "the arms' gradients differ",
        "the treatment's per-token gradient equals the baseline's: the arms do not differ "
        "in their loss",
    )


PROPERTY_CHECKS = (
    "minibatch_invariance",
    "padding_invariance",
    "mask_equals_removal",
    "finite_on_stress",
    "on_policy_gradient",
    "reads_anchor_logprobs",
)
"""The per-loss checks, in report order (`arms_differ` is per plan)."""


def property_checks(
    loss: LossLike, fixture: Fixture | None = None, stress: Fixture | None = None
) -> dict[str, PropertyResult]:
    """Every per-loss property of `loss` (set A and the stress fixture by default). A loss that
    raises on a fixture fails that property, with the error as its note."""
    fixture = fixture or generate_fixture()
    stress = stress or generate_fixture(stress_spec())
    runs: dict[str, Callable[[], PropertyResult | None]] = {
        "minibatch_invariance": lambda: minibatch_invariance(loss, fixture),
        "padding_invariance": lambda: padding_invariance(loss, fixture),
        "mask_equals_removal": lambda: mask_equals_removal(loss, fixture),
        "finite_on_stress": lambda: finite_on_stress(loss, stress),
        "on_policy_gradient": lambda: on_policy_gradient(loss, fixture),
        "reads_anchor_logprobs": lambda: reads_anchor_logprobs(loss, fixture),
    }
    out = {}
    for name, run in runs.items():
        result = _guarded(name, run)
        if result is not None:
            out[name] = result
    return out


def _guarded(name: str, run: Callable[[], PropertyResult | None]) -> PropertyResult | None:
    try:
        return run()
    except (ValueError, RuntimeError, TypeError) as err:  # the loss refused the batch
        return PropertyResult(name, False, None, "runs", f"the loss raised: {err}")


def run_properties(
    losses: Mapping[str, LossLike],
    roles: Mapping[str, str] | None = None,
    *,
    fixture: Fixture | None = None,
    stress: Fixture | None = None,
) -> dict[str, Any]:
    """The property report of a plan's arms: `{"arms": {arm: {check: row}}, "plan": {...},
    "passed"}`. `roles` (`{"baseline": arm, "treatment": arm}`) adds `arms_differ`; leave it out
    when the arms do not differ in their loss (a plan whose switch is not `loss`)."""
    fixture = fixture or generate_fixture()
    stress = stress or generate_fixture(stress_spec())
    arms = {
        arm: {k: r.to_dict() for k, r in property_checks(loss, fixture, stress).items()}
        for arm, loss in losses.items()
    }
    plan_level: dict[str, Any] = {}
    if roles:
        base, treat = losses[roles["baseline"]], losses[roles["treatment"]]
        result = _guarded("arms_differ", lambda: arms_differ(base, treat, fixture))
        assert result is not None
        plan_level["arms_differ"] = result.to_dict()
    rows = [r for checks in arms.values() for r in checks.values()] + list(plan_level.values())
    return {
        "fixture_sha256": fixture.sha256(),
        "stress_fixture_sha256": stress.sha256(),
        "tolerance": {"rtol": RTOL, "atol": ATOL, "differ_min": DIFFER_MIN},
        "arms": arms,
        "plan": plan_level,
        "passed": all(r["passed"] for r in rows),
    }


def property_rows(report: Mapping[str, Any]) -> tuple[Check, ...]:
    """One `Check` per property: `properties.<arm>.<check>`, then `properties.arms_differ`."""
    rows = [
        Check(f"properties.{arm}.{name}", r["measured"], r["bound"], r["passed"], r["note"])
        for arm, checks in report["arms"].items()
        for name, r in checks.items()
    ]
    rows += [
        Check(f"properties.{name}", r["measured"], r["bound"], r["passed"], r["note"])
        for name, r in report["plan"].items()
    ]
    return tuple(rows)

"""Correctness preflight: our losses against the plan's pinned baseline and reference.

For each `correctness_preflight.paths[i]` of a plan, on one fixed fixture (see `fixtures`):

- our baseline arm's loss vs the `baseline_revision` (value and gradient w.r.t. current log-probs),
- our treatment arm's loss vs the `reference_revision` (value and gradient),

each reference obtained either by executing its pinned source from a checkout the user named
(`sources={"owner/repo": path}`) or, without one, by losslab's re-derivation (labelled as such).
Values are compared in the reference's value convention (Stable-RL returns -A*sg(w)*M*logp, not
the surrogate), gradients with the arm's loss as trained. Errors are computed in float64 and
checked against the plan's `tolerances`; the report has the seed report's fields plus, per check,
the tolerance used and pass/fail, and the share of tokens the clip and the mask fired on.

Beside the references, every arm's loss object gets the reference-free property checks of
`conformance.properties` (report key `properties`, rows `properties.<arm>.<check>`;
docs/properties.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.atomic import atomic_write_json
from losslab.checks import Check, PhaseResult
from losslab.conformance.classify import classify
from losslab.conformance.fixtures import Fixture, generate_fixture, stress_spec
from losslab.conformance.frameworks import (
    ReferenceResult,
    ResolvedReference,
    rederive,
    resolve_reference,
)
from losslab.conformance.metrics import Tolerance, check_tolerance
from losslab.conformance.ours import run_ours
from losslab.conformance.pinned import PinnedSourceError, run_pinned
from losslab.conformance.properties import property_rows, run_properties
from losslab.conformance.provenance import provenance_of
from losslab.conformance.sandbox import blocked_from_gradients
from losslab.plan import Plan, RevisionError, parse_revision
from losslab.plan.user_loss import UserLossError

CHECKS = ("baseline_loss", "baseline_gradient", "reference_loss", "reference_gradient")
PRECISION = "float32 CPU torch (Tinker logprobs dtype); errors computed in float64"

LossCallable = Callable[[Any], Any]  # TokenData -> LossOutput (loss, metrics, kept_D)


class PreflightError(ValueError):
    """The preflight cannot run as asked (bad plan path, unknown reference, missing source)."""


@dataclass(frozen=True)
class Implementation:
    """The loss under test for one arm.

    Args:
        loss_fn: the arm's loss as trained; its gradient is compared with the reference's.
        value_fn: the same loss written in the reference's value convention (defaults to
            `loss_fn`); its value is compared with the reference's loss.
        label: what the report calls it (e.g. the registry spec string).
    """

    loss_fn: LossCallable
    value_fn: LossCallable | None = None
    label: str = ""
    value_label: str = ""


def implementation_revision() -> str:
    """`losslab <version> losslab/losses sha256 <hex>` over the loss package's source files."""
    import losslab
    import losslab.losses

    root = Path(losslab.losses.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return f"losslab {losslab.__version__} losslab/losses/*.py sha256 {h.hexdigest()}"


def _value_spec(loss_fn: Any, ref: ResolvedReference) -> Any:
    """Our loss re-bound to the reference's value convention (gradient unchanged)."""
    from losslab.losses import get_loss

    if getattr(loss_fn, "user", None) is not None:
        return loss_fn  # code is compared as written: its value is what it returns
    if ref.value_convention == "logprob" and getattr(loss_fn, "params", {}).get(
        "surrogate"
    ) not in (None, "logprob"):
        params = {k: v for k, v in loss_fn.params.items() if v is not None}  # None = default
        return get_loss(loss_fn.name, **{**params, "surrogate": "logprob"})
    return loss_fn


def _spec_text(loss_fn: Any) -> str:
    params = getattr(loss_fn, "params", None)
    if params is None:
        return getattr(loss_fn, "__name__", repr(loss_fn))
    return f"{loss_fn.name}(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"


def plan_implementations(
    plan: Any,
    path: Any,
    losses: Mapping[str, Any] | None = None,
    *,
    sources: Mapping[str, Path] | None = None,
    offline: bool = False,
) -> dict[str, Implementation]:
    """Our implementation of the plan's baseline and treatment arms for `path`.

    The loss objects are `losses` (default: `arm_losses(plan)`), the very objects the arms train
    with; they come from the plan's resolved losses, never from re-reading the loss text.
    """
    from losslab.conformance.arm_losses import arm_losses

    if losses is None:
        try:
            losses = arm_losses(plan, sources=sources, offline=offline)
        except ValueError as exc:  # code that does not import, a pinned function not had
            raise PreflightError(str(exc)) from exc
    out = {}
    for role, rev_text in (
        ("baseline", path.baseline_revision),
        ("treatment", path.reference_revision),
    ):
        arm = plan.arm(role)
        loss_fn = losses[arm.name]
        ref = resolve_reference(parse_revision(rev_text))
        value_fn = _value_spec(loss_fn, ref)
        out[role] = Implementation(
            loss_fn, value_fn, label=f"{arm.name}: {loss_fn.spec}", value_label=_spec_text(value_fn)
        )
    return out


def _obtain(
    ref: ResolvedReference,
    fixture: Fixture,
    sources: Mapping[str, Path],
    strict_sources: bool,
    fetch: bool = True,
    allow_rederivation: bool = False,
    offline: bool = False,
) -> ReferenceResult:
    """The reference's outputs on `fixture`, from (in order) the user's `--source` checkout,
    the pinned commit fetched into losslab's cache, or, only when asked for (or for a framework
    with no fetchable commit, Spindle), losslab's labelled re-derivation."""
    from losslab.conformance.fetch import FetchError, fetch_pinned

    fw = ref.framework
    checkout = sources.get(ref.revision.repo)

    def rederived(reason: str) -> ReferenceResult:
        if fw.rederivation is None:
            raise PreflightError(
                f"{reason}; and losslab has no re-derivation of {ref.revision.repo} to fall back on"
            )
        result = rederive(ref, fixture, torch.float32)
        result.source["fallback_reason"] = reason
        return result

    if fw.installed is not None:
        # an installed release (TRL's trainer method), never git source: --source names it
        if checkout is None:
            raise PreflightError(f"revision {ref.revision.text!r}: {fw.unfetchable_reason}")
        try:
            return fw.installed(ref, Path(checkout), fixture)
        except RevisionError as err:
            raise PreflightError(str(err)) from err
    if checkout is not None:
        try:
            return run_pinned(ref, Path(checkout), fixture)
        except PinnedSourceError as err:
            if strict_sources or not allow_rederivation:
                raise
            result = rederived(str(err))
            result.source["label"] = (
                "FALLBACK: pinned source could not be used; " + result.source["label"]
            )
            return result
    if not fw.fetchable:
        result = rederived(fw.unfetchable_reason)
        return result
    if not fetch:
        if allow_rederivation:
            return rederived("fetching pinned sources was turned off (--no-fetch)")
        raise PreflightError(
            f"revision {ref.revision.text!r}: fetching is off and no --source names "
            f"{ref.revision.repo}; pass --source, allow fetching, or --allow-rederivation"
        )
    try:
        files = fetch_pinned(ref.revision, offline=offline)
    except FetchError as err:
        if not allow_rederivation:
            raise
        return rederived(str(err))
    return run_pinned(ref, files, fixture)


def _run_ours(
    fn: LossCallable, fixture: Fixture
) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    return run_ours(fn, fixture)


def _fractions(
    blocked_D: list[np.ndarray], fixture: Fixture, scope: str = "all"
) -> dict[str, float | int | None]:
    """Share of loss tokens (and of those with A != 0) the clip/mask zeroed; with scope
    "nonzero_adv" (sets inferred from gradients) only the A != 0 share is known."""
    loss_tok = np.concatenate([s.loss_mask != 0 for s in fixture.sequences])
    nonzero = np.concatenate([(s.loss_mask != 0) & (s.advantages != 0) for s in fixture.sequences])
    blocked = np.concatenate(blocked_D) & loss_tok
    if scope == "nonzero_adv":
        return {
            "fraction": None,
            "fraction_nonzero_adv": float((blocked & nonzero).sum() / max(nonzero.sum(), 1)),
            "tokens": None,
            "tokens_nonzero_adv": int((blocked & nonzero).sum()),
        }
    return {
        "fraction": float(blocked.sum() / max(loss_tok.sum(), 1)),
        "fraction_nonzero_adv": float((blocked & nonzero).sum() / max(nonzero.sum(), 1)),
        "tokens": int(blocked.sum()),
        "tokens_nonzero_adv": int((blocked & nonzero).sum()),
    }


def _blocked(
    loss_fn: Any, kept_D: list[np.ndarray], grad_D: list[np.ndarray], fixture: Fixture
) -> tuple[list[np.ndarray], str]:
    """Tokens our loss blocked: its keep mask, or for code (which reports none) the loss tokens
    with A != 0 whose gradient is exactly zero, as for pinned references."""
    if getattr(loss_fn, "user", None) is None:
        return [~k for k in kept_D], "all"
    return blocked_from_gradients(fixture, grad_D), "nonzero_adv"


def _set_difference(
    ours: list[np.ndarray], theirs: list[np.ndarray], fixture: Fixture, limit: int = 10
) -> dict[str, Any]:
    """(seq, t) loss tokens with A != 0 that one side blocks and the other keeps."""
    only_ours, only_ref = [], []
    for i, (a, b, s) in enumerate(zip(ours, theirs, fixture.sequences, strict=True)):
        live = (s.loss_mask != 0) & (s.advantages != 0)
        only_ours += [(i, int(t)) for t in np.flatnonzero(a & ~b & live)]
        only_ref += [(i, int(t)) for t in np.flatnonzero(b & ~a & live)]
    return {
        "only_ours": len(only_ours),
        "only_reference": len(only_ref),
        "examples_only_ours": only_ours[:limit],
        "examples_only_reference": only_ref[:limit],
    }


def _normalization(base: ResolvedReference, ref: ResolvedReference) -> str:
    parts = [
        "sum over loss-mask tokens (Tinker forward_backward convention); ours: per-datum "
        "unpacked list, reduction='sum'"
    ]
    for role, r in (("baseline", base), ("reference", ref)):
        parts.append(f"{role}: {r.framework.aggregation_of(r)}")
    return "; ".join(parts)


def _compared(role: str, impl: Implementation, ref: ResolvedReference) -> dict[str, str]:
    value = impl.value_label or impl.label
    conv = (
        "Stable-RL value convention: -sum A*sg(min(r, c))*M*logp (surrogate='logprob')"
        if ref.value_convention == "logprob"
        else "the surrogate value"
    )
    return {
        f"{role}_loss": f"ours {value} vs {ref.revision.short}, {conv}",
        f"{role}_gradient": f"d loss/d current logprobs of ours as trained ({impl.label}) vs "
        f"{ref.revision.short}",
    }


def _tolerance(path: Any, name: str) -> Tolerance:
    tol_block = getattr(path.tolerances, name, None)
    if tol_block is None:
        raise PreflightError(
            f"correctness_preflight path {path.id!r}: tolerances.{name} "
            "is missing; expected atol, rtol (and min_cosine)"
        )
    if isinstance(tol_block, Tolerance):
        return tol_block
    return Tolerance.from_dict(
        tol_block.model_dump() if hasattr(tol_block, "model_dump") else dict(tol_block),
        where=f"tolerances.{name}",
    )


def _check_entry(ours: Any, theirs: Any, tol: Tolerance) -> tuple[dict, dict]:
    chk = check_tolerance(ours, theirs, tol)
    return chk.metrics.to_dict(), {
        "passed": chk.passed,
        "tolerance": tol.to_dict(),
        "violations": chk.violations,
        "cosine_ok": chk.cosine_ok,
        "worst_index": chk.worst_index,
        "worst_excess": chk.worst_excess,
    }


def _fixed_input(fixture: Fixture) -> dict[str, Any]:
    return {
        "sha256": fixture.sha256(),
        "description": fixture.description(),
        "generator": fixture.spec.to_generator_block() if fixture.spec else None,
    }


def run_path(
    path: Any,
    implementations: Mapping[str, Implementation],
    fixture: Fixture,
    sources: Mapping[str, Path] | None = None,
    strict_sources: bool = False,
    *,
    fetch: bool = True,
    allow_rederivation: bool = False,
    offline: bool = False,
    stress_fixture: Fixture | None = None,
) -> dict[str, Any]:
    """Run one preflight path and return its report entry (see module docstring).

    On `fixture` (set A) both sides are checked; on `stress_fixture` (default
    `fixtures.stress_spec()`: old != sampler, r > c, |log r| > 20, a fully masked sequence) the
    treatment is checked again against its reference, so a missing cap, a wrong anchor, a wrong
    threshold or a sign error fails. A failed check gets a `classification`: the single
    convention change that would make it pass, if any.
    """
    sources = sources or {}
    resolved = {}
    for role, key in (("baseline", "baseline_revision"), ("reference", "reference_revision")):
        text = getattr(path, key)
        if not text:
            raise PreflightError(f"correctness_preflight path {path.id!r}: {key} is missing")
        resolved[role] = resolve_reference(parse_revision(text))
    how = dict(fetch=fetch, allow_rederivation=allow_rederivation, offline=offline)
    results = {
        role: _obtain(r, fixture, sources, strict_sources, **how) for role, r in resolved.items()
    }
    resolved = {role: results[role].resolved or r for role, r in resolved.items()}
    provenance = {role: provenance_of(res.source) for role, res in results.items()}
    entry: dict[str, Any] = {
        "id": path.id,
        "provenance": provenance,
        "fixed_input": _fixed_input(fixture),
        "baseline_revision": path.baseline_revision,
        "reference_revision": path.reference_revision,
        "implementation_revision": implementation_revision(),
        "implementation": {},
        "reference_sources": {role: r.source for role, r in results.items()},
        "precision": PRECISION,
        "normalization": _normalization(resolved["baseline"], resolved["reference"]),
        "compared": {},
        "errors": {},
        "checks": {},
        "fired": {},
        "token_set_differences": {},
        "classification": {},
    }
    for role, impl_key in (("baseline", "baseline"), ("reference", "treatment")):
        impl, ref, res = implementations[impl_key], resolved[role], results[role]
        value_loss, _, _ = _run_ours(impl.value_fn or impl.loss_fn, fixture)
        _, grad_D, kept_D = _run_ours(impl.loss_fn, fixture)
        entry["implementation"][impl_key] = {
            "loss": impl.label,
            "value_convention_loss": impl.value_label or impl.label,
            # where each hyperparameter came from: plan text, a pinned revision or the default
            "provenance": dict(getattr(impl.loss_fn, "provenance", None) or {}),
        }
        code = getattr(impl.loss_fn, "code", None)
        if code:  # the arm's loss is code: which file, hash and commit was checked
            entry["implementation"][impl_key]["code"] = dict(code)
        entry["compared"].update(_compared(role, impl, ref))
        tols = {kind: _tolerance(path, f"{role}_{kind}") for kind in ("loss", "gradient")}
        for kind, ours, theirs in (
            ("loss", value_loss, res.loss),
            ("gradient", grad_D, res.grad_D),
        ):
            name = f"{role}_{kind}"
            entry["errors"][name], entry["checks"][name] = _check_entry(ours, theirs, tols[kind])
        if not all(entry["checks"][f"{role}_{k}"]["passed"] for k in ("loss", "gradient")):
            entry["classification"][role] = classify(
                impl.loss_fn, impl.value_fn or impl.loss_fn, res, fixture, tols, resolved=ref
            )
        blocked_ours, scope = _blocked(impl.loss_fn, kept_D, grad_D, fixture)
        entry["fired"][impl_key] = {
            "ours": _fractions(blocked_ours, fixture, scope),
            "reference": _fractions(res.blocked_D, fixture, res.blocked_scope),
        }
        entry["token_set_differences"][role] = _set_difference(blocked_ours, res.blocked_D, fixture)
    stress = stress_fixture if stress_fixture is not None else generate_fixture(stress_spec())
    entry["stress"] = _stress_block(
        path,
        implementations["treatment"],
        resolved["reference"],
        stress,
        sources,
        strict_sources,
        how,
    )
    entry["passed"] = (
        all(c["passed"] for c in entry["checks"].values()) and entry["stress"]["passed"]
    )
    return entry


def _stress_block(
    path: Any,
    impl: Implementation,
    ref: ResolvedReference,
    fixture: Fixture,
    sources: Mapping[str, Path],
    strict_sources: bool,
    how: Mapping[str, Any],
) -> dict[str, Any]:
    """The treatment vs its reference on the stress fixture (same tolerances, same source)."""
    res = _obtain(ref, fixture, sources, strict_sources, **how)
    block: dict[str, Any] = {
        "fixed_input": _fixed_input(fixture),
        "provenance": provenance_of(res.source),
        "compared": "treatment vs reference only: the baseline GRPO loss and Spindle's ppo "
        "differ by construction where l - l_s > 20 (losslab guards the log-ratio, Spindle "
        "does not), which is not what this fixture is for",
        "errors": {},
        "checks": {},
    }
    tols = {kind: _tolerance(path, f"reference_{kind}") for kind in ("loss", "gradient")}
    value_loss, _, _ = _run_ours(impl.value_fn or impl.loss_fn, fixture)
    _, grad_D, kept_D = _run_ours(impl.loss_fn, fixture)
    for kind, ours, theirs in (("loss", value_loss, res.loss), ("gradient", grad_D, res.grad_D)):
        name = f"reference_{kind}"
        block["errors"][name], block["checks"][name] = _check_entry(ours, theirs, tols[kind])
    block["passed"] = all(c["passed"] for c in block["checks"].values())
    if not block["passed"]:
        block["classification"] = classify(
            impl.loss_fn, impl.value_fn or impl.loss_fn, res, fixture, tols, resolved=ref
        )
    blocked_ours, _ = _blocked(impl.loss_fn, kept_D, grad_D, fixture)
    block["token_set_differences"] = _set_difference(blocked_ours, res.blocked_D, fixture)
    return block


def _merged_provenance(paths: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-level `provenance`: per side, one record with a one-line `summary` (paths joined
    when a plan has several and they differ)."""
    out: dict[str, Any] = {}
    for side in ("baseline", "reference"):
        records = [p["provenance"][side] for p in paths]
        summaries = list(dict.fromkeys(r["summary"] for r in records))
        merged = dict(records[0])
        merged["executed"] = all(r["executed"] for r in records)
        merged["summary"] = (
            summaries[0]
            if len(summaries) == 1
            else "; ".join(
                f"{p['id']}: {r['summary']}" for p, r in zip(paths, records, strict=True)
            )
        )
        out[side] = merged
    return out


def run_preflight(
    plan_path: str | Path | Plan,
    sources: Mapping[str, Path] | None = None,
    fixture: Fixture | None = None,
    implementations: Mapping[str, Implementation] | None = None,
    strict_sources: bool = False,
    losses: Mapping[str, Any] | None = None,
    *,
    fetch: bool = True,
    allow_rederivation: bool = False,
    offline: bool = False,
    stress_fixture: Fixture | None = None,
) -> dict[str, Any]:
    """Run every `correctness_preflight.paths[i]` of the plan at `plan_path`.

    Args:
        plan_path: the plan JSON (validated with `losslab.plan.load_plan`), or a loaded `Plan`.
        sources: {"owner/repo": checkout path} whose pinned source is executed (overrides
            fetching).
        fixture: the fixed input (default `generate_fixture()`: set A, seed 0).
        implementations: {"baseline": ..., "treatment": ...} losses under test (default: the
            plan's arms resolved to `losslab.losses`); used to test mutated copies.
        strict_sources: raise instead of falling back when a named checkout lacks the pinned
            commit or the source cannot be extracted/run (the fallback needs
            `allow_rederivation` anyway).
        losses: `{arm name: LossFn}` the arms train with (the runner passes its own, so the
            checked objects are the trained ones); default `arm_losses(plan)`.
        fetch: fetch a pinned commit no `sources` entry names into losslab's cache (see
            `losslab.conformance.fetch`) and execute it; the default.
        allow_rederivation: where the pinned source cannot be had (offline, no cache), compare
            against losslab's re-derivation instead of failing; it is labelled "pinned source
            NOT executed" in `provenance`. Spindle, which has no fetchable commit, is always
            re-derived (labelled with the commit its text came from).
        offline: never touch the network (a cached commit is still used).
        stress_fixture: the second fixture (default `fixtures.stress_spec()`).
    """
    from losslab.plan import load_plan

    plan = plan_path if isinstance(plan_path, Plan) else load_plan(plan_path)
    fixture = fixture or generate_fixture()
    if plan.correctness_preflight is None or not plan.correctness_preflight.paths:
        where = "the plan" if isinstance(plan_path, Plan) else str(plan_path)
        raise PreflightError(f"{where}: correctness_preflight.paths is empty; nothing to check")
    paths = []
    for path in plan.correctness_preflight.paths:
        if path.kind != "loss":
            raise PreflightError(
                f"correctness_preflight path {path.id!r}: kind = {path.kind!r}; "
                "expected 'loss' (module paths are checked by `losslab conform`)"
            )
        try:
            impls = (
                dict(implementations)
                if implementations
                else plan_implementations(plan, path, losses, sources=sources, offline=offline)
            )
            paths.append(
                run_path(
                    path,
                    impls,
                    fixture,
                    sources,
                    strict_sources,
                    fetch=fetch,
                    allow_rederivation=allow_rederivation,
                    offline=offline,
                    stress_fixture=stress_fixture,
                )
            )
        except (RevisionError, PinnedSourceError, UserLossError) as err:
            raise PreflightError(f"correctness_preflight path {path.id!r}: {err}") from err
    if losses is None:  # the objects the paths were checked with: pinned code from `sources`
        from losslab.conformance.arm_losses import arm_losses

        try:
            losses = arm_losses(plan, sources=sources, offline=offline)
        except UserLossError as err:
            raise PreflightError(f"property checks: {err}") from err
    properties = plan_properties(plan, losses, fixture=fixture, stress=stress_fixture)
    named = {
        parse_revision(getattr(p, key)).repo
        for p in plan.correctness_preflight.paths
        for key in ("baseline_revision", "reference_revision")
    }
    return {
        "required": plan.correctness_preflight.required,
        "passed": all(p["passed"] for p in paths) and properties["passed"],
        "provenance": _merged_provenance(paths),
        "properties": properties,
        "unused_sources": sorted(set(sources or {}) - named),
        "torch": torch.__version__,
        "paths": paths,
    }


def plan_properties(
    plan: Plan,
    losses: Mapping[str, Any] | None = None,
    *,
    fixture: Fixture | None = None,
    stress: Fixture | None = None,
) -> dict[str, Any]:
    """The property checks (`conformance.properties`) of every arm's loss object (`losses`,
    default `arm_losses(plan)`: the objects the arms train), plus `arms_differ` between the
    baseline and the treatment when the plan's arms differ in their loss (`switch` = loss)."""
    from losslab.conformance.arm_losses import arm_losses

    losses = losses if losses is not None else arm_losses(plan)
    roles = plan.arm_roles() if plan.switch == "loss" else None
    per_arm = {arm.name: losses[arm.name] for arm in plan.arms}
    return run_properties(per_arm, roles, fixture=fixture, stress=stress)


NOT_APPLICABLE = "the plan has no correctness_preflight paths"


def _violations_note(check: Mapping[str, Any]) -> str:
    """`violations` is a count of elements outside atol + rtol*|ref| (conformance.metrics)."""
    n = int(check.get("violations") or 0)
    parts = [f"{n} element(s) outside tolerance"] if n else []
    if check.get("cosine_ok") is False:
        parts.append("cosine below min_cosine")
    return "; ".join(parts)


def preflight_checks(report: Mapping[str, Any]) -> tuple[Check, ...]:
    """One row per check of every path: set A's, then the stress fixture's (`stress_<check>`);
    measured are the three error metrics, bound the tolerance that was applied. Then one row
    per property check (`properties.<arm>.<check>`, `properties.arms_differ`)."""
    rows = []
    for path in report["paths"]:
        stress = path.get("stress") or {"checks": {}, "errors": {}}
        checks = {**path["checks"], **{f"stress_{k}": v for k, v in stress["checks"].items()}}
        errors = {**path["errors"], **{f"stress_{k}": v for k, v in stress["errors"].items()}}
        for name, chk in checks.items():
            err = errors.get(name, {})
            tol = chk.get("tolerance", {})
            rows.append(
                Check(
                    name=f"{path['id']}.{name}",
                    measured={
                        key: err.get(key)
                        for key in ("max_abs_error", "relative_l2_error", "cosine_similarity")
                    },
                    bound=", ".join(f"{k} {v:g}" for k, v in tol.items() if v is not None),
                    passed=bool(chk["passed"]),
                    note=_violations_note(chk),
                )
            )
    if "properties" in report:  # reports written before the property checks have none
        rows.extend(property_rows(report["properties"]))
    return tuple(rows)


def preflight_phase(
    plan: Plan,
    losses: Mapping[str, Any] | None = None,
    *,
    allow_rederivation: bool = True,
    sources: Mapping[str, Path] | None = None,
) -> PhaseResult:
    """The run's correctness preflight: `run_preflight` on the plan and the loss objects the
    arms train (`losses`), its report as the artifact, one `Check` per compared quantity.

    Pinned sources are fetched; where they cannot be had (offline, no cache) the run goes on
    with the labelled re-derivation (`allow_rederivation`), which the report's `provenance`
    states ("pinned source NOT executed"); `sources` ({"owner/repo": checkout}, `losslab run
    --source`) executes a pinned commit from a local checkout instead; `losslab preflight` is
    the strict check. A plan with `correctness_preflight.required: false` records failures
    without stopping the run. A plan without paths gets the property checks alone
    (`plan_properties`).
    """
    cp = plan.correctness_preflight
    if cp is None or not cp.paths:
        # no pinned reference to compare with: the reference-free property checks still run
        properties = plan_properties(plan, losses)
        facts = {"note": NOT_APPLICABLE, "properties": properties}
        required = cp.required if cp is not None else True
        return PhaseResult(facts, checks=property_rows(properties), required=required)
    report = run_preflight(
        plan, sources=sources, losses=losses, allow_rederivation=allow_rederivation
    )
    return PhaseResult(report, checks=preflight_checks(report), required=cp.required)


def write_report(report: Mapping[str, Any], out: str | Path) -> Path:
    """Write the report atomically (`losslab.atomic`: temp file in the same folder, then
    os.replace)."""
    return atomic_write_json(out, report, indent=1, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")

"""Plan loss names -> `losslab.losses` registry specs.

A plan names an arm's loss either with a plan name (`grpo_clip_eps0.2`, `dppo_divergence_mask`)
or with a registry spec string (`ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)`). Plan names
take their hyperparameters from the name or from the correctness preflight's pinned revisions, so
the trained loss is the one the preflight checks:

- `grpo_clip_eps<eps>`: `ppo(clip_low_threshold=1-eps, clip_high_threshold=1+eps)`; the baseline
  revision's `clip <low>/<high>` (or its `clip_low_threshold=`/`clip_high_threshold=` keywords) must
  agree. `grpo_clip` without eps takes the clip from the baseline revision.
- `dppo_divergence_mask`: the reference revision's `compute_policy_loss_with_mask(loss_mode=...,
  clip_ratio=..., clip_ratio_c=...)` (sail-sg/Stable-RL): `loss_mode` `dppo_binary_tv|kl` picks the
  divergence, a `_recompute` suffix anchors on recomputed old log-probs instead of the sampler's,
  `clip_ratio` is the divergence threshold (both directions), `clip_ratio_c` the IS-weight cap.

`plan` may not import `losses` (layering), so the registry's names are mirrored in
`REGISTRY_LOSS_NAMES`; `losslab.losses.parse_loss_spec` checks the parameters when the run builds
the loss.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

REGISTRY_LOSS_NAMES: frozenset[str] = frozenset(
    {
        "importance_sampling",
        "ppo",
        "cispo",
        "dro",
        "cross_entropy",
        "dppo_binary_tv",
        "dppo_binary_kl",
    }
)
"""Names in `losslab.losses`' registry (docs/interfaces.md); keep in step with that package."""

PLAN_LOSS_NAMES = ("grpo_clip_eps<eps>", "grpo_clip", "dppo_divergence_mask")

_GRPO_RE = re.compile(r"^grpo_clip(?:_eps(?P<eps>\d+(?:\.\d+)?))?$")
_SPEC_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?:\((?P<args>.*)\))?\s*$", re.S)
_REVISION_RE = re.compile(
    r"^(?P<repo>[^@\s]+)@(?P<commit>[0-9a-fA-F]+):(?P<path>[^:]+)::"
    r"(?P<function>[A-Za-z_][A-Za-z0-9_.]*)\((?P<args>[^)]*)\)",
)
_CLIP_TEXT_RE = re.compile(r"clip\s+(?P<low>\d+(?:\.\d+)?)\s*/\s*(?P<high>\d+(?:\.\d+)?)")


class LossNameError(ValueError):
    """An arm's loss name cannot be resolved to a registry spec; the message says why."""


@dataclass(frozen=True)
class Revision:
    """A pinned source revision `repo@commit:path::function(kw=value, ...)`."""

    repo: str
    commit: str
    path: str
    function: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    free_text: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ResolvedLoss:
    """An arm's loss as a registry spec, and where its hyperparameters came from."""

    plan_name: str
    spec: str
    source: str


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


def _split_top_level(args: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(args):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    parts.append(args[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_kwargs(args: str) -> tuple[dict[str, Any], list[str]]:
    kwargs: dict[str, Any] = {}
    free: list[str] = []
    for part in _split_top_level(args):
        key, eq, value = part.partition("=")
        if eq and key.strip().isidentifier():
            kwargs[key.strip()] = _literal(value)
        else:
            free.append(part)
    return kwargs, free


def parse_revision(text: str) -> Revision:
    """Parse `repo@commit:path::function(kw=value, ...)`; text after the call is ignored.

    Arguments that are not `kw=literal` (e.g. Spindle's `clip 0.8/1.2`) are kept in `free_text`.
    """
    match = _REVISION_RE.match(text.strip())
    if match is None:
        raise LossNameError(
            f"{text[:80]!r} is not a pinned revision of the form repo@commit:path::function(kw=value)"
        )
    kwargs, free = _parse_kwargs(match["args"])
    return Revision(match["repo"], match["commit"], match["path"], match["function"], kwargs, free)


def parse_registry_spec(text: str) -> tuple[str, dict[str, Any]]:
    """Split a registry spec `name(kw=value, ...)` into its name and literal keyword values."""
    match = _SPEC_RE.match(text)
    if match is None:
        raise LossNameError(f"{text!r} is not a loss spec of the form name(kw=value, ...)")
    name, args = match["name"], match["args"] or ""
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError as exc:
        raise LossNameError(f"{text!r}: arguments are not valid keyword=value pairs") from exc
    assert isinstance(call, ast.Call)  # f(...) always parses to a call
    if call.args:
        raise LossNameError(f"{text!r}: give every argument as keyword=value")
    kwargs: dict[str, Any] = {}
    for kw in call.keywords:
        try:
            kwargs[str(kw.arg)] = ast.literal_eval(kw.value)
        except ValueError as exc:
            raise LossNameError(f"{text!r}: the value of {kw.arg!r} is not a literal") from exc
    return name, kwargs


def format_spec(name: str, kwargs: dict[str, Any]) -> str:
    """`name(k=v, ...)` with Python literals, the form `losslab.losses.parse_loss_spec` reads."""
    args = ", ".join(f"{k}={_fmt(v)}" for k, v in kwargs.items())
    return f"{name}({args})"


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace('"', '\\"') + '"'
    if isinstance(value, float):
        return repr(round(value, 12))
    return repr(value)


def _grpo_clip_from_revision(revision: str | None) -> tuple[float, float] | None:
    if not revision:
        return None
    try:
        rev = parse_revision(revision)
    except LossNameError:
        rev = None
    if rev is not None:
        if "clip_low_threshold" in rev.kwargs and "clip_high_threshold" in rev.kwargs:
            return float(rev.kwargs["clip_low_threshold"]), float(rev.kwargs["clip_high_threshold"])
        if "clip_ratio" in rev.kwargs:
            eps = float(rev.kwargs["clip_ratio"])
            return 1.0 - eps, 1.0 + eps
    match = _CLIP_TEXT_RE.search(revision)
    if match:
        return float(match["low"]), float(match["high"])
    return None


def _resolve_grpo(name: str, eps_text: str | None, baseline_revision: str | None) -> ResolvedLoss:
    pinned = _grpo_clip_from_revision(baseline_revision)
    if eps_text is not None:
        eps = float(eps_text)
        if not 0 < eps < 1:
            raise LossNameError(f"{name!r}: clip eps {eps} is outside (0, 1)")
        low, high = round(1.0 - eps, 12), round(1.0 + eps, 12)
        if pinned is not None and (abs(pinned[0] - low) > 1e-12 or abs(pinned[1] - high) > 1e-12):
            raise LossNameError(
                f"{name!r} implies clip {low}/{high} but the baseline revision pins "
                f"clip {pinned[0]}/{pinned[1]}"
            )
        source = "name"
    elif pinned is not None:
        low, high = pinned
        source = "correctness_preflight baseline_revision"
    else:
        raise LossNameError(
            f"{name!r} gives no clip eps and no baseline revision pins one; "
            "write grpo_clip_eps<eps>, e.g. grpo_clip_eps0.2"
        )
    spec = format_spec("ppo", {"clip_low_threshold": low, "clip_high_threshold": high})
    return ResolvedLoss(name, spec, source)


def _resolve_dppo(name: str, reference_revision: str | None) -> ResolvedLoss:
    if not reference_revision:
        raise LossNameError(
            f"{name!r} takes its divergence, threshold and cap from the correctness preflight's "
            "reference_revision, and the plan has none"
        )
    rev = parse_revision(reference_revision)
    mode = rev.kwargs.get("loss_mode")
    anchor = "sampler"
    if isinstance(mode, str) and mode.endswith("_recompute"):
        mode, anchor = mode.removesuffix("_recompute"), "recomputed"
    if mode not in ("dppo_binary_tv", "dppo_binary_kl"):
        raise LossNameError(
            f"{name!r}: reference_revision loss_mode={rev.kwargs.get('loss_mode')!r} is not one of "
            "dppo_binary_tv, dppo_binary_kl (optionally with _recompute)"
        )
    missing = [k for k in ("clip_ratio", "clip_ratio_c") if k not in rev.kwargs]
    if missing:
        raise LossNameError(
            f"{name!r}: reference_revision does not pin {', '.join(missing)} (Stable-RL's code "
            "falls back to clip_ratio_c=10 but its YAML sets 3.0, so it must be pinned)"
        )
    threshold, cap = rev.kwargs["clip_ratio"], rev.kwargs["clip_ratio_c"]
    for key, value in (("clip_ratio", threshold), ("clip_ratio_c", cap)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise LossNameError(f"{name!r}: reference_revision {key}={value!r} is not a number > 0")
    spec = format_spec(
        mode, {"low": threshold, "high": threshold, "anchor": anchor, "clip_ratio_c": cap}
    )
    return ResolvedLoss(name, spec, "correctness_preflight reference_revision")


def resolve_loss(
    name: str, baseline_revision: str | None = None, reference_revision: str | None = None
) -> ResolvedLoss:
    """Resolve an arm's `loss` to a `losslab.losses` registry spec string.

    Args:
        name: the arm's `loss` as written in the plan.
        baseline_revision: the correctness preflight path's `baseline_revision` (GRPO clip).
        reference_revision: the path's `reference_revision` (DPPO divergence, threshold, cap).

    Raises:
        LossNameError: the name is neither a plan loss name nor a registry spec, or the revision
            it needs does not pin its hyperparameters.
    """
    grpo = _GRPO_RE.match(name)
    if grpo:
        return _resolve_grpo(name, grpo["eps"], baseline_revision)
    if name == "dppo_divergence_mask":
        return _resolve_dppo(name, reference_revision)
    head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", name)
    if head and head.group(0) in REGISTRY_LOSS_NAMES:
        registry_name, kwargs = parse_registry_spec(name)
        return ResolvedLoss(name, format_spec(registry_name, kwargs), "registry spec")
    raise LossNameError(
        f"{name!r} is not a known loss; expected a plan loss name "
        f"({', '.join(PLAN_LOSS_NAMES)}) or a registry spec name(kw=value, ...) with name in "
        f"{{{', '.join(sorted(REGISTRY_LOSS_NAMES))}}}"
    )

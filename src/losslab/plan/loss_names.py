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

Pinned revisions `owner/repo@commit:path::function(kw=value, ...) — description` are parsed here
(`parse_revision`, `Revision`, `RevisionError`): the one revision parser, which
`losslab.conformance` imports. Argument lists and spec strings use `losslab.callspec`'s grammar.

The registry's names and each loss's parameters are the losses' declarations
(`losslab.losses.declarations`, stdlib only, the table `get_loss` reads too); registry specs use
the same grammar as `losslab.losses.parse_loss_spec` (bare words allowed, so the display form
`LossFn.spec` pastes into a plan). Every resolved loss's parameters are checked at plan time
against its declaration (`losslab.plan.semantics.loss_problems`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from losslab.callspec import (
    CallSpecError,
    format_call,
    parse_call,
    parse_value,
    split_keyword,
    split_top_level,
)
from losslab.losses.declarations import LOSSES
from losslab.plan.user_loss import UserLossError, UserLossRef, is_user_loss_spec, parse_user_loss

PLAN_LOSS_NAMES = ("grpo_clip_eps<eps>", "grpo_clip", "dppo_divergence_mask")

_GRPO_RE = re.compile(r"^grpo_clip(?:_eps(?P<eps>\d+(?:\.\d+)?))?$")
_REVISION_HEAD = re.compile(
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)"
    r"@(?P<commit>[0-9a-fA-F]{7,40})"
    r":(?P<path>[^:\s]+)"
    r"::(?P<function>[A-Za-z_][A-Za-z0-9_.]*)"
    r"(?:\((?P<args>.*)\))?",
    re.DOTALL,
)
_CLIP_SHORTHAND = re.compile(r"\s*clip\s+(?P<lo>[0-9.eE+-]+)\s*/\s*(?P<hi>[0-9.eE+-]+)\s*")
_CLIP_WORD = re.compile(r"\s*clip\s")  # an argument that starts with the word `clip`
_DESCRIPTION_SEPARATORS = (" \u2014 ", " -- ")


class LossNameError(ValueError):
    """An arm's loss name cannot be resolved to a registry spec; the message says why."""


class RevisionError(ValueError):
    """A revision string that cannot be parsed or resolved; the message names the string.

    The one error type for revisions: `losslab.conformance` raises it too (unknown reference,
    bad parameter).
    """


@dataclass(frozen=True)
class Revision:
    """A pinned source revision `owner/repo@commit:path::function(kw=value, ...) — description`.

    Keyword arguments are Python literals (`loss_mode='dppo_binary_tv'`, `clip_ratio=0.15`); the
    shorthand `clip LO/HI` (absolute ratio bounds) is parsed into `clip_bounds`; any other
    argument text is kept as `notes` and never interpreted; the text after ` — ` (or ` -- `) is
    the description.
    """

    text: str
    repo: str
    commit: str
    path: str
    function: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    clip_bounds: tuple[float, float] | None = None  # from the `clip LO/HI` shorthand
    notes: tuple[str, ...] = ()  # argument text that is not kw=value (kept, not interpreted)
    description: str = ""
    args: str = ""  # the argument text between the parentheses, as written

    @property
    def short(self) -> str:
        """`repo@commit8:path::function`, for labels."""
        return f"{self.repo}@{self.commit[:8]}:{self.path}::{self.function}"

    @property
    def free_text(self) -> list[str]:
        """Every argument that is not `kw=value` (notes and the `clip LO/HI` shorthand), in order."""
        return [p for p in split_top_level(self.args) if p and split_keyword(p) is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "repo": self.repo,
            "commit": self.commit,
            "path": self.path,
            "function": self.function,
            "kwargs": dict(self.kwargs),
            "clip_bounds": list(self.clip_bounds) if self.clip_bounds else None,
            "notes": list(self.notes),
            "description": self.description,
        }


SOURCE_PLAN = "plan"
"""Provenance of a loss parameter written in the plan's loss text (a registry spec's keyword, or
the eps of `grpo_clip_eps<eps>`)."""
SOURCE_BASELINE_REVISION = "correctness_preflight baseline_revision"
SOURCE_REFERENCE_REVISION = "correctness_preflight reference_revision"
SOURCE_DEFAULT = "default"
"""Provenance of a parameter the plan does not set: the loss function's own default (filled in
by `losslab.losses.build_loss`, since `plan` may not import `losses`)."""


@dataclass(frozen=True)
class LossParam:
    """One loss hyperparameter and where its value came from (`SOURCE_*`)."""

    value: Any
    source: str


@dataclass(frozen=True)
class ResolvedLoss:
    """An arm's loss, resolved once when the plan is loaded: the value the run carries.

    `losslab.losses.build_loss(resolved)` builds the loss from it; the preflight checks and the
    arms train that same object (`losslab.conformance.arm_losses`). `spec` is only the display
    form (and what `plan show` prints); nothing re-parses it.

    Args:
        plan_name: the arm's `loss` as written in the plan.
        name: the `losslab.losses` registry name (`ppo`, `dppo_binary_tv`, ...).
        params: the parameters the plan determines, each with its provenance; every other
            parameter of the loss takes its default.
    """

    plan_name: str
    name: str
    params: Mapping[str, LossParam] = field(default_factory=dict)
    user: UserLossRef | None = None
    """Set when the arm's loss is code (`losslab.plan.user_loss`): the file, module or pinned
    function, its keywords, detected signature and provenance; `name` is then `USER_LOSS`."""

    @property
    def values(self) -> dict[str, Any]:
        """`{parameter: value}` of the parameters the plan determines."""
        return {k: p.value for k, p in self.params.items()}

    @property
    def spec(self) -> str:
        """Display form `name(k=v, ...)` (Python literals; floats rounded to 12 decimals); a loss
        named as code shows as written."""
        if self.user is not None:
            return self.user.text
        return format_spec(self.name, self.values)

    @property
    def source(self) -> str:
        """The provenances of the parameters, in order of first use (`registry spec` if none)."""
        sources = list(dict.fromkeys(p.source for p in self.params.values()))
        return ", ".join(sources) or SOURCE_PLAN

    def with_params(self, **values: Any) -> ResolvedLoss:
        """A copy with `values` set (source `plan`), e.g. a mutated loss for a test."""
        params = dict(self.params)
        params.update({k: LossParam(v, SOURCE_PLAN) for k, v in values.items()})
        return replace(self, params=params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_name": self.plan_name,
            "name": self.name,
            "params": {k: {"value": p.value, "source": p.source} for k, p in self.params.items()},
            **({"user_code": self.user.provenance()} if self.user is not None else {}),
        }


USER_LOSS = "user_code"
"""`ResolvedLoss.name` of a loss named as code (no registry declaration applies to it)."""


def _revision_hint(head: str) -> str:
    """Which part of a malformed `owner/repo@commit:path::function(...)` is wrong."""
    if "@" not in head:
        return "missing '@commit'"
    after = head.split("@", 1)[1]
    commit = re.match(r"[0-9a-fA-F]*", after).group(0)  # type: ignore[union-attr]
    rest = after[len(commit) :]
    if not 7 <= len(commit) <= 40 or (rest and rest[0] not in ":"):
        return "commit must be 7-40 hex digits"
    if not rest.startswith(":") or rest.startswith("::"):
        return "missing ':path'"
    if "::" not in rest:
        return "missing '::function'"
    return "path must have no spaces, function be an identifier, arguments be in (...)"


def parse_revision(text: str) -> Revision:
    """Parse `owner/repo@commit:path::function(kw=value, ...) — description`.

    Arguments are split and read with `losslab.callspec` (values are Python literals or inf/nan;
    no bare words). The commit is lower-cased.

    Raises:
        RevisionError: naming the string and the part that is malformed (head, a keyword value
            that is not a literal, a keyword given twice, a `clip LO/HI` that is not two numbers).
    """
    if not isinstance(text, str) or not text.strip():
        raise RevisionError(f"revision {text!r}: expected 'owner/repo@commit:path::function(...)'")
    head, description = text.strip(), ""
    for sep in _DESCRIPTION_SEPARATORS:
        if sep in head:
            head, description = (s.strip() for s in head.split(sep, 1))
            break
    match = _REVISION_HEAD.fullmatch(head)
    if match is None:
        raise RevisionError(
            f"revision {text!r}: {_revision_hint(head)}; "
            "expected 'owner/repo@commit:path::function(kw=value, ...)'"
        )
    path_problem = _repo_path_problem(match["path"])
    if path_problem is not None:
        raise RevisionError(f"revision {text!r}: path {match['path']!r} {path_problem}")
    args = match["args"] or ""
    kwargs: dict[str, Any] = {}
    notes: list[str] = []
    clip_bounds = None
    for part in filter(None, split_top_level(args)):
        keyword = split_keyword(part)
        clip = _CLIP_SHORTHAND.fullmatch(part)
        if keyword is not None:
            key, value_text = keyword
            try:
                value = parse_value(value_text)
            except CallSpecError as err:
                raise RevisionError(
                    f"revision {text!r}: argument {key}={value_text} is not a Python literal "
                    "(number, string, bool, None, list, dict)"
                ) from err
            if key in kwargs:
                raise RevisionError(f"revision {text!r}: argument {key} given twice")
            kwargs[key] = value
        elif clip is not None or _CLIP_WORD.match(part):
            # a `clip ...` argument is a pin, never a note: `clip nan/nan` or `clip a/b` left as
            # a note would leave the baseline unpinned while the preflight still passes
            try:
                clip_bounds = (float(clip["lo"]), float(clip["hi"])) if clip else None
            except ValueError:
                clip_bounds = None
            if clip_bounds is None or not all(math.isfinite(b) for b in clip_bounds):
                raise RevisionError(
                    f"revision {text!r}: 'clip LO/HI' needs two finite numbers, got {part.strip()!r}"
                )
        else:
            notes.append(part)
    return Revision(
        text=text,
        repo=match["repo"],
        commit=match["commit"].lower(),
        path=match["path"],
        function=match["function"],
        kwargs=kwargs,
        clip_bounds=clip_bounds,
        notes=tuple(notes),
        description=description,
        args=args,
    )


def _repo_path_problem(path: str) -> str | None:
    """Why a revision's file path is not a plain path inside the repository (None if it is):
    the path is read from a checkout (`--source repo=PATH`) or a git commit, so `..`, an
    absolute path or a NUL byte could read a file outside it."""
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith(("/", "\\")):
        return "is absolute; expected a path inside the repository"
    parts = path.replace("\\", "/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part; expected a plain path inside the repository"
    return None


def parse_registry_spec(text: str) -> tuple[str, dict[str, Any]]:
    """Split a registry spec `name(kw=value, ...)` into its name and keyword values.

    The grammar is `losslab.losses.parse_loss_spec`'s: Python literals, inf/nan, or bare words
    (`reduction=token-mean`), so `LossFn.spec` pastes back. A bare word where a number belongs
    (`clip_low_threshold=foo`) is refused at `losslab plan check` by the loss's declaration.
    """
    try:
        return parse_call(text, what="loss spec", bare_words=True)
    except CallSpecError as exc:
        raise LossNameError(str(exc)) from exc


def format_spec(name: str, kwargs: dict[str, Any]) -> str:
    """`name(k=v, ...)` with Python literals, the form `losslab.losses.parse_loss_spec` reads.

    Floats are rounded to 12 decimals first, so `1 - 0.2` is written `0.8`.
    """
    return format_call(name, {k: _rounded(v) for k, v in kwargs.items()})


def _rounded(value: Any) -> Any:
    """Floats to 12 decimals, so `1 - 0.2` is the plan's `0.8` (what the spec text shows)."""
    return round(value, 12) if isinstance(value, float) else value


def _pinned_revision(name: str, role: str, text: str) -> Revision:
    try:
        return parse_revision(text)
    except RevisionError as exc:
        raise LossNameError(f"{name!r} reads the correctness preflight's {role}: {exc}") from exc


def _grpo_clip_from_revision(name: str, revision: str | None) -> tuple[float, float] | None:
    """The baseline revision's absolute clip bounds: thresholds, `clip_ratio` eps, or `clip LO/HI`."""
    if not revision:
        return None
    rev = _pinned_revision(name, "baseline_revision", revision)
    try:
        return pinned_clip(rev)
    except RevisionError as exc:
        raise LossNameError(f"{name!r}: baseline_revision {exc}") from exc


_CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")


def pinned_clip(rev: Revision) -> tuple[float, float] | None:
    """The absolute ratio-clip bounds a baseline revision pins: both thresholds, a `clip_ratio`
    eps, or the `clip LO/HI` shorthand; None when it pins none.

    Raises:
        RevisionError: a pin that is not a finite number, a threshold without the other, or
            bounds that are not low < 1 < high (no clip could be checked against it).
    """
    given = [k for k in _CLIP_KEYS if k in rev.kwargs]
    if len(given) == 1:
        missing = next(k for k in _CLIP_KEYS if k not in given)
        raise RevisionError(f"pins {given[0]} but not {missing}; pin both")
    if given:
        bounds = {k: rev.kwargs[k] for k in _CLIP_KEYS}
    elif "clip_ratio" in rev.kwargs:
        bounds = {"clip_ratio": rev.kwargs["clip_ratio"]}
    elif rev.clip_bounds is None:
        return None
    else:
        bounds = dict(zip(("clip LO", "clip HI"), rev.clip_bounds, strict=True))
    for key, value in bounds.items():
        if not _is_number(value):
            raise RevisionError(f"{key}={value!r} is not a finite number")
    if "clip_ratio" in bounds:
        low, high = 1.0 - bounds["clip_ratio"], 1.0 + bounds["clip_ratio"]
    else:
        low, high = (float(v) for v in bounds.values())
    if not low < 1.0 < high:
        raise RevisionError(f"clip {low:g}/{high:g} is not low < 1 < high")
    return low, high


def _is_number(value: Any) -> bool:
    """A finite int or float: NaN or infinity as a pin would make every comparison pass."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _resolve_grpo(name: str, eps_text: str | None, baseline_revision: str | None) -> ResolvedLoss:
    pinned = _grpo_clip_from_revision(name, baseline_revision)
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
        source = SOURCE_PLAN
    elif pinned is not None:
        low, high = round(pinned[0], 12), round(pinned[1], 12)
        source = SOURCE_BASELINE_REVISION
    else:
        raise LossNameError(
            f"{name!r} gives no clip eps and no baseline revision pins one; "
            "write grpo_clip_eps<eps>, e.g. grpo_clip_eps0.2"
        )
    params = {"clip_low_threshold": low, "clip_high_threshold": high}
    return ResolvedLoss(name, "ppo", {k: LossParam(v, source) for k, v in params.items()})


def _resolve_dppo(name: str, reference_revision: str | None) -> ResolvedLoss:
    if not reference_revision:
        raise LossNameError(
            f"{name!r} takes its divergence, threshold and cap from the correctness preflight's "
            "reference_revision, and the plan has none"
        )
    rev = _pinned_revision(name, "reference_revision", reference_revision)
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
        # NaN fails `> 0`; inf passes here and the loss's declaration decides (a cap may be inf)
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise LossNameError(f"{name!r}: reference_revision {key}={value!r} is not a number > 0")
    params = {"low": threshold, "high": threshold, "anchor": anchor, "clip_ratio_c": cap}
    return ResolvedLoss(
        name,
        mode,
        {k: LossParam(_rounded(v), SOURCE_REFERENCE_REVISION) for k, v in params.items()},
    )


def resolve_loss(
    name: str,
    baseline_revision: str | None = None,
    reference_revision: str | None = None,
    *,
    base_dir: str | Path | None = None,
) -> ResolvedLoss:
    """Resolve an arm's `loss` to a `losslab.losses` registry name and its parameters.

    Called once per arm when the plan is validated (`Plan.loss(arm)` returns the result); call
    it directly only for a loss text that is not in a plan.

    Args:
        name: the arm's `loss` as written in the plan.
        baseline_revision: the correctness preflight path's `baseline_revision` (GRPO clip).
        reference_revision: the path's `reference_revision` (DPPO divergence, threshold, cap).
        base_dir: the plan file's folder, which a loss file's path is relative to (default: the
            current directory).

    Raises:
        LossNameError: the name is neither a plan loss name nor a registry spec, or the revision
            it needs does not pin its hyperparameters.
    """
    grpo = _GRPO_RE.match(name)
    if grpo:
        return _resolve_grpo(name, grpo["eps"], baseline_revision)
    if name == "dppo_divergence_mask":
        return _resolve_dppo(name, reference_revision)
    if is_user_loss_spec(name):
        try:
            user = parse_user_loss(name, Path(base_dir) if base_dir is not None else None)
        except UserLossError as exc:
            raise LossNameError(str(exc)) from exc
        params = {k: LossParam(v, SOURCE_PLAN) for k, v in user.kwargs.items()}
        return ResolvedLoss(name, USER_LOSS, params, user=user)
    head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", name)
    if head and head.group(0) in LOSSES:
        registry_name, kwargs = parse_registry_spec(name)
        return ResolvedLoss(
            name, registry_name, {k: LossParam(_rounded(v), SOURCE_PLAN) for k, v in kwargs.items()}
        )
    raise LossNameError(
        f"{name!r} is not a known loss; expected a plan loss name "
        f"({', '.join(PLAN_LOSS_NAMES)}) or a registry spec name(kw=value, ...) with name in "
        f"{{{', '.join(sorted(LOSSES))}}}, or your code: path/file.py::function(k=v, ...), "
        "package.module:function(...) or owner/repo@<40-hex commit>:path.py::function(...)"
    )

"""The reference-framework protocol: what one adapter module declares (`Framework`), and the
records a reference yields (`Resolution` -> `ResolvedReference`, `ReferenceResult`).

Framework modules import this module only (never the package's `__init__`, which lists them,
nor anything above them); `losslab.conformance.frameworks` holds the registry and the
framework-neutral dispatch (`resolve_reference`, `rederive`).
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import textwrap
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from losslab.conformance.fixtures import Fixture
from losslab.conformance.pinned_runner import adapter_code
from losslab.plan import Revision, RevisionError

# The declared vocabulary of loss families a reference function can implement (`Framework.
# families`, `ResolvedReference.loss_family`). `losslab crosscheck` compares the implementations
# of ONE family ("every DPPO implementation" is `family="dppo"`).
LOSS_FAMILIES: dict[str, str] = {
    "dppo": "DPPO: the policy gradient with a trust-region mask on a divergence (binary TV or "
    "binary KL) of the current policy from an anchor",
    "ppo_clip": "PPO's clipped-ratio objective (and mask-form ablations of it)",
    "dual_clip": "dual-clip PPO: the clipped objective with the loss of A < 0 tokens capped "
    "at -A*c (Ye et al. 2019, arXiv 1912.09729)",
    "dapo": "DAPO: PPO's clipped objective with Clip-Higher (eps_high > eps_low) and the "
    "token-level mean over the batch (arXiv 2503.14476)",
    "dr_grpo": "Dr. GRPO: PPO's clipped objective over a constant length instead of each "
    "response's (arXiv 2503.20783)",
    "gspo": "GSPO: a sequence-level (length-normalised) importance ratio, clipped per "
    "sequence (arXiv 2507.18071)",
    "sapo": "SAPO: a soft sigmoid gate on the ratio instead of a hard clip (arXiv 2511.20347)",
    "gmpo": "GMPO: the geometric mean of the clipped token ratios (arXiv 2507.20673)",
    "icepop": "IcePop: tokens whose rollout-vs-trainer ratio leaves [low, high] are masked "
    "(Ring-1T, arXiv 2510.18855)",
    "rollout_correction": "truncated / masked importance sampling of the trainer-vs-rollout "
    "ratio (TIS/MIS, token or sequence level)",
    "clip_cov": "Clip-Cov: the gradient of a few high-covariance tokens detached "
    "(arXiv 2505.22617)",
    "kl_cov": "KL-Cov: a KL penalty on a few high-covariance tokens (arXiv 2505.22617)",
    "cispo": "CISPO: a detached clipped importance weight times the log-prob",
    "dro": "DRO: log-prob times advantage with a squared log-ratio penalty",
    "importance_sampling": "the ratio-weighted policy gradient, no clip and no mask",
    "cross_entropy": "supervised negative log-likelihood",
}
VALUE_CONVENTIONS = ("logprob", "surrogate")  # -A*sg(w)*M*logp, or the ratio form


class FrameworkDefinitionError(ValueError):
    """A framework adapter breaks the protocol (unknown family, an adapter that is not
    self-contained, a name registered twice); the message names the framework."""


@dataclass(frozen=True)
class Resolution:
    """What a framework's `resolve` returns: the effective parameters the reference will use
    (defaults filled in), the loss family of this configuration, and notes saying where a
    default came from or where a real config would differ."""

    params: dict[str, Any]
    loss_family: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResolvedReference:
    """A revision mapped to its framework, with every effective parameter spelled out."""

    revision: Revision
    framework: Framework
    params: dict[str, Any]
    loss_family: str
    notes: tuple[str, ...] = ()

    @property
    def value_convention(self) -> str:
        """What the loss value means (`Framework.value_convention`)."""
        return self.framework.value_convention

    @property
    def loss_name(self) -> str:
        for key in ("loss_name", "loss_mode", "dppo_type"):
            if key in self.params:
                return str(self.params[key])
        return self.revision.function


@dataclass
class ReferenceResult:
    """A reference's outputs on a fixture (per-datum lists in datum order)."""

    loss: float
    per_sequence_loss: list[float]
    grad_D: list[np.ndarray]  # d loss / d current log-probs, full length, zero on prompt tokens
    blocked_D: list[np.ndarray]  # bool: loss tokens whose gradient the clip/trust region zeroed
    source: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    blocked_scope: str = "all"  # "nonzero_adv": blocked_D only knows tokens with A != 0
    resolved: ResolvedReference | None = None  # as resolved against the executed commit


@dataclass(frozen=True)
class Rederivation:
    """losslab's own restatement of a framework's formula (it never imports the reference), so
    a preflight without source still compares against an independent statement of it.

    `outputs(ref, fixture, dtype)` gives the numbers (loss, per-sequence losses, gradient,
    blocked tokens; `frameworks.rederive` labels them); `loss_term_abs_sum(ref, fixture)` is the
    float64 sum of |each token's contribution to the loss|, the golden files' loss-tolerance
    scale (`float64_check.loss_term_abs_sum_float64`).
    """

    outputs: Callable[[ResolvedReference, Fixture, Any], ReferenceResult]  # Any: a torch dtype
    loss_term_abs_sum: Callable[[ResolvedReference, Fixture], float]


@dataclass(frozen=True)
class LosslabConfig:
    """The `losslab.losses` configuration matching one reference configuration.

    `loss`/`params` give the gradient (the loss as it would be trained); `value_params` are
    overrides that put the VALUE in the reference's convention (e.g. surrogate="logprob").
    `reason` is set (and `loss` is None) when no configuration can reproduce the reference;
    set WITH a `loss`, the configuration is the nearest one and `reason` says, in one line, the
    convention it cannot reproduce (e.g. a dual clip, a log-ratio guard), shown by
    `losslab atlas` wherever the two differ.
    """

    loss: str | None
    params: dict[str, Any] = field(default_factory=dict)
    value_params: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    reason: str = ""

    @property
    def spec(self) -> str:
        from losslab.losses import get_loss

        if self.loss is None:
            return f"(none: {self.reason})"
        return get_loss(self.loss, **self.params).spec


@dataclass(frozen=True)
class Framework:
    """One framework's adapter: a module `frameworks/<name>.py` defines `FRAMEWORK =
    Framework(...)` and the registry (`frameworks.FRAMEWORKS`) lists it.

    What it declares:
        name, repo, functions: the adapter's name and the `repo::function`s it adapts.
        families: the loss families (keys of `LOSS_FAMILIES`) its functions implement;
            `resolve` says which one each configuration is.
        resolve(revision, defaults, origin) -> Resolution: the revision's arguments as the
            function's effective parameters, unset ones from `defaults` (read from the pinned
            commit's config classes by `read_defaults(files)`, else `recorded_defaults`, read at
            `recorded_commit`; `origin` says which, for the notes). RevisionError naming the
            revision on an argument the reference does not accept.
        call_reference(fn, payload, space, rt) -> dict: our per-datum fixture in the function's
            own input layout, run INSIDE the isolated pinned runner (`pinned_runner.py`), which
            receives the function's SOURCE TEXT and executes it with builtins only. So it must
            be self-contained: import what it needs (torch only) inside the function, and use
            only its arguments (`payload["sequences"]`, `payload["params"]` = the resolved
            parameters, `payload["revision_kwargs"]`, `space` = the reference file's executed
            namespace, `rt` = the runner's helpers: `rt.pad`, `rt.Config`, `rt.call`,
            `rt.first`, `rt.split`, `rt.numeric`, `rt.padded_outputs`). A module-level name
            (a constant, a helper, `Any` outside an annotation) would be a NameError there;
            `Framework(...)` refuses it up front with FrameworkDefinitionError naming it. It
            returns {"loss", "per_sequence_loss", "grad_D", "native_metrics"}.
        losslab_config(ref, fixture=None) -> LosslabConfig: the `losslab.losses` configuration
            that reproduces the reference's gradient, or the reason none can.
        value_convention: "logprob" (-A*sg(w)*M*logp) or "surrogate" (the ratio form).
        aggregation: what the call reduces to, in words; `describe_aggregation(ref)` may
            spell it out per configuration (default "<repo>: <aggregation>").
        rederivation: losslab's restatement of the formula (`Rederivation`), or None when the
            pinned source must run. `extra_roots` (more names of the function's file to
            extract, e.g. a config validator), `stub_names` (type-only names bound to empty
            classes), `fetchable`/`unfetchable_reason` (no commit can be fetched: re-derived),
            `example_revisions` ({crosscheck name: revision}, at the recorded commit).
            `installed`: for a reference that runs from an installed release rather than
            git source (TRL), `installed(ref, source, fixture)` executes it from the
            `--source` path (`frameworks/trl.py`).
    """

    name: str
    repo: str
    functions: tuple[str, ...]
    families: tuple[str, ...]
    resolve: Callable[[Revision, dict[str, Any], str], Resolution]
    call_reference: Callable[..., dict[str, Any]]  # executed inside pinned_runner.py
    losslab_config: Callable[[ResolvedReference, Fixture | None], LosslabConfig]
    value_convention: str
    aggregation: str
    describe_aggregation: Callable[[ResolvedReference], str] | None = None
    read_defaults: Callable[[Any], dict[str, Any]] | None = None  # GitFiles -> defaults
    recorded_defaults: Mapping[str, Any] = field(default_factory=dict)
    recorded_commit: str = ""
    rederivation: Rederivation | None = None
    extra_roots: tuple[str, ...] = ()
    stub_names: tuple[str, ...] = ()
    fetchable: bool = True
    unfetchable_reason: str = ""
    # (ref, source path, fixture) -> ReferenceResult: a reference executed from an INSTALLED
    # release named by `--source` (TRL's trainer method) instead of extracted git source
    installed: Callable[[ResolvedReference, Any, Fixture], ReferenceResult] | None = None
    example_revisions: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in LOSS_FAMILIES]
        if not self.families or unknown:
            raise FrameworkDefinitionError(
                f"framework {self.name!r}: families = {self.families!r}; expected one or more "
                f"of {sorted(LOSS_FAMILIES)} (add a family to LOSS_FAMILIES for another)"
            )
        if self.value_convention not in VALUE_CONVENTIONS:
            raise FrameworkDefinitionError(
                f"framework {self.name!r}: value_convention = {self.value_convention!r}; "
                f"expected one of {list(VALUE_CONVENTIONS)}"
            )
        foreign = _names_from_outside(self.call_source, self.call_reference.__name__)
        if foreign:
            raise FrameworkDefinitionError(
                f"call_reference of framework {self.name!r} must be self-contained: name "
                f"{foreign[0]!r} is not defined inside it ({', '.join(foreign)} would be a "
                "NameError in the pinned runner, which executes the function's text alone with "
                "builtins only; import inside the function and pass values through payload/rt)"
            )

    @cached_property
    def call_source(self) -> str:
        """The text of `call_reference`, as the pinned runner receives it."""
        try:
            return textwrap.dedent(inspect.getsource(self.call_reference))
        except (OSError, TypeError) as err:
            raise FrameworkDefinitionError(
                f"framework {self.name!r}: the source of call_reference cannot be read ({err}); "
                "define it with `def` in a .py file"
            ) from err

    def aggregation_of(self, ref: ResolvedReference) -> str:
        """The reduction as run for `ref`, in words."""
        if self.describe_aggregation is not None:
            return self.describe_aggregation(ref)
        return f"{self.repo}: {self.aggregation}"

    def defaults(self, files: Any | None) -> tuple[dict[str, Any], str]:
        """Effective config defaults and where they came from (the pinned commit, or the
        values recorded at `recorded_commit` when no source is available)."""
        if files is not None and self.read_defaults is not None:
            try:
                return self.read_defaults(files), f"read from {self.repo}@{files.commit[:8]}"
            except RevisionError as err:
                return dict(self.recorded_defaults), (
                    f"recorded from {self.repo}@{self.recorded_commit[:8]}; the executed "
                    f"commit has none ({err})"
                )
        return dict(self.recorded_defaults), (
            f"recorded from {self.repo}@{self.recorded_commit[:8]} (source not read)"
        )


def _names_from_outside(source: str, function: str) -> list[str]:
    """Names the adapter's text reads from a global scope that, in the pinned runner, holds
    only builtins: compiled exactly as the runner compiles it (`pinned_runner.adapter_code`)."""
    try:
        code = adapter_code(source)
    except SyntaxError as err:
        raise FrameworkDefinitionError(f"{function}: its source does not compile ({err})") from err
    wanted: set[str] = set()
    stack: list[types.CodeType] = [code]
    while stack:
        current = stack.pop()
        for ins in dis.get_instructions(current):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                wanted.add(str(ins.argval))
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return sorted(wanted - set(dir(builtins)) - {function})


def refuse_unknown_arguments(revision: Revision, known: Sequence[str], accepted: str) -> None:
    """Raise RevisionError naming the revision's arguments outside `known`; `accepted` says in
    words what the framework takes (ends the message)."""
    unknown = set(revision.kwargs) - set(known)
    if unknown:
        raise RevisionError(
            f"revision {revision.text!r}: unknown arguments {sorted(unknown)}; {accepted}"
        )


def _literal(node: ast.expr | None) -> Any:
    """The literal default of a dataclass/pydantic field: `x: float = 0.2`,
    `field(default=0.2)`, `Field(0.2, ge=0)`; `...` when it is not a literal."""
    if node is None:
        return ...
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        if name in ("field", "Field"):
            for kw in node.keywords:
                if kw.arg == "default":
                    return _literal(kw.value)
            return _literal(node.args[0]) if node.args else ...
        return ...
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        return ...


def class_defaults(
    files: Any, path: str, class_name: str, keys: tuple[str, ...] | None
) -> dict[str, Any]:
    """Literal defaults of `keys` (None: every field with a literal default) in class
    `class_name` of `path` at the pinned commit, read with `ast` (nothing is executed). Fields
    inherited from a base class in the same file are followed. Raises RevisionError naming the
    class when a key has no literal default."""
    text = files.read(path)
    if text is None:
        raise RevisionError(
            f"{files.revision.repo}@{files.commit[:8]}: {path} does not exist (needed for "
            f"the {class_name} defaults)"
        )
    classes = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    out: dict[str, Any] = {}
    name: str | None = class_name
    while name in classes and (keys is None or len(out) < len(keys)):
        node = classes[name]
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                key = stmt.target.id
                if (keys is None or key in keys) and key not in out:
                    value = _literal(stmt.value)
                    if value is not ...:
                        out[key] = value
        bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
        name = bases[0] if bases else None
    if name is not None and name not in classes and name == class_name:
        raise RevisionError(
            f"{files.revision.repo}@{files.commit[:8]}: {path} has no class {class_name}"
        )
    missing = [k for k in keys or () if k not in out]
    if missing:
        raise RevisionError(
            f"{files.revision.repo}@{files.commit[:8]}: {path}::{class_name} has no literal "
            f"default for {missing}"
        )
    return out

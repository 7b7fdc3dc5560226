"""The open reference registry: one small adapter module per framework.

Each module in this package defines `FRAMEWORK = Framework(...)`, which says

- which repository and functions it adapts (`repo`, `functions`),
- how a revision's arguments become the function's effective parameters (`resolve`), with the
  defaults the framework's own config classes give where the revision leaves them unset
  (`read_defaults` reads them from the pinned commit with `ast`; `recorded_defaults` are the
  same values read at `recorded_commit`, used when no source is at hand, and labelled so),
- how our per-datum fixture becomes the function's input layout, inside the isolated pinned
  runner (`call_reference`: a self-contained function whose source is sent to
  `pinned_runner.py`; it may import torch only),
- the value convention and aggregation, and the `losslab.losses` configuration that reproduces
  the framework's gradient (`losslab_config`), or a precise reason why none can.

Adding a sixth framework is one file here; `registry()` discovers it.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from losslab.plan import Revision, RevisionError


@dataclass(frozen=True)
class LosslabConfig:
    """The `losslab.losses` configuration matching one reference configuration.

    `loss`/`params` give the gradient (the loss as it would be trained); `value_params` are
    overrides that put the VALUE in the reference's convention (e.g. surrogate="logprob").
    `reason` is set (and `loss` is None) when no configuration can reproduce the reference.
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
    """One framework's adapter (see the package docstring)."""

    name: str
    repo: str
    functions: tuple[str, ...]
    resolve: Callable[[Revision, dict[str, Any], str], Any]  # (rev, defaults, origin) -> ref
    call_reference: Callable[..., dict[str, Any]]  # executed inside pinned_runner.py
    losslab_config: Callable[[Any], LosslabConfig]  # ResolvedReference -> config
    value_convention: str  # "logprob" (-A*sg(w)*M*logp) or "surrogate" (the ratio form)
    aggregation: str  # what the fixture's call reduces to, in words
    read_defaults: Callable[[Any], dict[str, Any]] | None = None  # GitFiles -> defaults
    recorded_defaults: Mapping[str, Any] = field(default_factory=dict)
    recorded_commit: str = ""
    rederive: Callable[..., Any] | None = None  # (ref, fixture, dtype) -> ReferenceResult
    extra_roots: tuple[str, ...] = ()
    stub_names: tuple[str, ...] = ()
    fetchable: bool = True
    unfetchable_reason: str = ""
    example_revisions: tuple[str, ...] = ()  # one per function, at the recorded commit

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


_REGISTRY: dict[str, Framework] | None = None


def registry() -> dict[str, Framework]:
    """Every framework module of this package, by name (discovered once)."""
    global _REGISTRY
    if _REGISTRY is None:
        found: dict[str, Framework] = {}
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
            module = importlib.import_module(f"{__name__}.{info.name}")
            fw = getattr(module, "FRAMEWORK", None)
            if isinstance(fw, Framework):
                found[fw.name] = fw
        _REGISTRY = found
    return _REGISTRY


def framework_for(repo: str, function: str) -> Framework:
    """The framework adapting `repo::function`; RevisionError listing the known ones otherwise."""
    for fw in registry().values():
        if fw.repo.lower() == repo.lower() and function in fw.functions:
            return fw
    known = ", ".join(f"{fw.repo}::{f}" for fw in registry().values() for f in fw.functions)
    raise RevisionError(
        f"no known reference for {repo}::{function}; losslab knows {known} "
        "(add a module to losslab/conformance/frameworks/ for another)"
    )


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

"""The reference registry: one adapter module per framework, and the framework-neutral dispatch.

Each module here defines `FRAMEWORK = Framework(...)` (the protocol: `base.Framework`) and owns
everything about its framework: how a revision's arguments become the function's effective
parameters, the loss family of each configuration, the function's input layout inside the
pinned runner, losslab's re-derivation of its formula where there is one, and the
`losslab.losses` configuration that reproduces it. `FRAMEWORK_MODULES` lists them, one line
each, like `backends.BACKENDS`: adding a framework is one module plus one line there
(docs/contributing.md).

`resolve_reference` maps a revision to its framework and effective parameters; `rederive`
runs a framework's re-derivation and labels it as such. No framework module imports this
`__init__` or anything above it (they import `base`), so dependencies point one way:
preflight/crosscheck/golden/pinned -> frameworks -> (fixtures, plan.Revision).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from losslab.conformance.frameworks.base import (  # noqa: F401 - the protocol, re-exported
    LOSS_FAMILIES,
    Framework,
    FrameworkDefinitionError,
    LosslabConfig,
    Rederivation,
    ReferenceResult,
    Resolution,
    ResolvedReference,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

FRAMEWORK_MODULES: tuple[str, ...] = (
    "losslab.conformance.frameworks.areal",
    "losslab.conformance.frameworks.openrlhf",
    "losslab.conformance.frameworks.prime_rl",
    "losslab.conformance.frameworks.skyrl",
    "losslab.conformance.frameworks.slime",
    "losslab.conformance.frameworks.skyrl_registry",
    "losslab.conformance.frameworks.spindle",
    "losslab.conformance.frameworks.stable_rl",
    "losslab.conformance.frameworks.tinker",
    "losslab.conformance.frameworks.trl",
    "losslab.conformance.frameworks.verl",
    "losslab.conformance.frameworks.verl_registry",
)
"""The registry: the module holding each framework's `FRAMEWORK`, one line each (imported when
the registry is first read)."""


def registry() -> dict[str, Framework]:
    """Every registered framework by name, in `FRAMEWORK_MODULES` order;
    FrameworkDefinitionError when a module has no `FRAMEWORK` or two share a name or a
    `repo::function`."""
    out: dict[str, Framework] = {}
    adapted: dict[tuple[str, str], str] = {}
    for path in FRAMEWORK_MODULES:
        fw = getattr(importlib.import_module(path), "FRAMEWORK", None)
        if not isinstance(fw, Framework):
            raise FrameworkDefinitionError(
                f"{path} (in FRAMEWORK_MODULES) defines no FRAMEWORK = Framework(...)"
            )
        if fw.name in out:
            raise FrameworkDefinitionError(f"framework {fw.name!r} is registered twice")
        for function in fw.functions:
            key = (fw.repo.lower(), function)
            if key in adapted:
                raise FrameworkDefinitionError(
                    f"framework {fw.name!r}: {fw.repo}::{function} is already adapted by "
                    f"{adapted[key]!r}"
                )
            adapted[key] = fw.name
        out[fw.name] = fw
    return out


def framework_for(repo: str, function: str) -> Framework:
    """The framework adapting `repo::function`; RevisionError listing the known ones otherwise."""
    frameworks = registry().values()
    for fw in frameworks:
        if fw.repo.lower() == repo.lower() and function in fw.functions:
            return fw
    known = ", ".join(f"{fw.repo}::{f}" for fw in frameworks for f in fw.functions)
    raise RevisionError(
        f"no known reference for {repo}::{function}; losslab knows {known} "
        "(add a module to losslab/conformance/frameworks/ for another)"
    )


def resolve_reference(revision: Revision, files: Any | None = None) -> ResolvedReference:
    """Map a revision to its framework adapter and its effective parameters. With `files` (a
    `GitFiles` of the pinned commit), unset parameters take the defaults of the framework's own
    config classes read at that commit; without, the defaults the adapter recorded (labelled in
    the notes).

    Raises RevisionError naming the revision when the repo/function is unknown or a parameter is
    not one the reference accepts.
    """
    try:
        fw = framework_for(revision.repo, revision.function)
    except RevisionError as err:
        raise RevisionError(f"revision {revision.text!r}: {err}") from None
    defaults, origin = fw.defaults(files)
    got = fw.resolve(revision, defaults, origin)
    if got.loss_family not in fw.families:
        raise FrameworkDefinitionError(
            f"framework {fw.name!r} resolved {revision.short} as a {got.loss_family!r} loss, "
            f"which is not among its declared families {list(fw.families)}"
        )
    return ResolvedReference(revision, fw, got.params, got.loss_family, got.notes)


def rederive(
    ref: ResolvedReference, fixture: Any, dtype: torch.dtype = torch.float32
) -> ReferenceResult:
    """Run losslab's re-derivation of `ref` on `fixture` (loss, per-sequence losses, gradient),
    labelled as a re-derivation; ValueError when the framework has none (its pinned source must
    be executed)."""
    fw = ref.framework
    if fw.rederivation is None:
        raise ValueError(
            f"{ref.revision.short}: losslab has no independent re-derivation of "
            f"{ref.revision.repo}; its pinned source must be executed (fetched or --source)"
        )
    numbers = fw.rederivation.outputs(ref, fixture, dtype)
    source = {
        "kind": "rederivation",
        "repo": ref.revision.repo,
        "label": f"losslab re-derivation of {ref.revision.short} (formula from the "
        "reference's source as documented; pinned source not executed)",
        "effective_params": ref.params,
        "notes": list(ref.notes),
        "text_commit": fw.recorded_commit,
    }
    return dataclasses.replace(
        numbers, source=source, resolved=ref, dtype=str(dtype).replace("torch.", "")
    )

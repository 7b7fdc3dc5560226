"""Correctness preflight: the arms' loss objects against the plan's pinned references.

Whenever a pinned source was not executed (offline, not cached, and no `--source` checkout), the
console says so, one line per re-derived side; the report carries the same as a banner and under
"What was not done".
"""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.conformance.preflight import PreflightError, preflight_phase
from losslab.report.preflight import preflight_summary
from losslab.runner.errors import RunError
from losslab.runner.protocols import PhaseContext


def run(ctx: PhaseContext) -> PhaseResult:
    # the plan and the loss objects the arms train: one source of truth
    sources = getattr(ctx.comp, "sources", None) or {}
    try:
        result = preflight_phase(ctx.comp.plan, ctx.comp.losses, sources=sources)
    except PreflightError as e:
        raise RunError(f"correctness preflight could not run: {e}") from e
    for line in not_executed_lines(result.artifact):
        ctx.log(line)
    return result


def not_executed_lines(report: dict) -> list[str]:
    """One console line per preflight side whose pinned source was not executed."""
    summary = preflight_summary(report) or {}
    return [
        f"WARNING pinned source NOT executed: {row['path']} {row['side']} "
        f"({row.get('revision') or '-'}): {row['summary']}; pass --source "
        f"{_repo(row.get('revision'))}=PATH (a checkout with the pinned commit) to execute it"
        for row in summary.get("provenance") or []
        if not row.get("executed")
    ]


def _repo(revision: str | None) -> str:
    """'owner/repo' of a revision 'owner/repo@commit:path::function(...)'."""
    repo = (revision or "").partition("@")[0]
    return repo if repo.count("/") == 1 else "OWNER/NAME"

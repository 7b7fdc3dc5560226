"""The correctness preflight as a reader needs it: where each side's reference came from, each
error with its tolerance and result, and how often clip/mask fired on the fixture.

Reads preflight.json as `losslab.conformance.preflight.run_preflight` writes it. When the artifact
carries a `provenance` block (per side, with a `summary` line) that text is used as is; otherwise
the line is derived from each path's `reference_sources` (`kind`: pinned_source or rederivation).
"""

from __future__ import annotations

from typing import Any

SIDES = {"baseline": "baseline", "reference": "treatment"}
"""reference_sources key -> the arm role whose loss it checks."""


def _repo_commit(revision: str | None) -> str:
    """'owner/repo@commit' from a revision text 'owner/repo@commit:path::function(...)'."""
    if not revision:
        return "?"
    return revision.split(":", 1)[0]


def _derived_line(source: dict[str, Any], revision: str | None) -> tuple[bool, str]:
    if source.get("kind") == "pinned_source":
        repo = _repo_commit(revision).split("@", 1)[0]
        line = (
            f"executed pinned source {repo}@{source.get('commit', '?')}, "
            f"file sha256 {source.get('file_sha256', '?')}"
        )
        return True, line
    line = "re-derivation by losslab, pinned source NOT executed"
    if source.get("fallback_reason"):
        line += f" (the pinned source could not be used: {source['fallback_reason']})"
    return False, line + f"; formula of {_repo_commit(revision)}"


def _given(block: Any, side: str) -> dict[str, Any] | None:
    """A `provenance` entry for `side` ({side: {"summary": ..., ...}} or {side: "summary"}), keyed
    by reference side (baseline/reference) or arm role (baseline/treatment)."""
    if not isinstance(block, dict):
        return None
    entry = block.get(side)
    if isinstance(entry, str):
        return {"summary": entry}
    return entry if isinstance(entry, dict) and entry.get("summary") else None


def _executed(entry: dict[str, Any], fallback: bool) -> bool:
    for key in ("executed", "pinned_source_executed"):
        if isinstance(entry.get(key), bool):
            return entry[key]
    text = str(entry["summary"]).lower()
    if "not executed" in text or "re-derivation" in text:
        return False
    return "executed pinned source" in text or fallback


def _provenance(report: dict[str, Any], path: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    sources = path.get("reference_sources") or {}
    for side, role in SIDES.items():
        revision = path.get(f"{side}_revision")
        derived_exec, derived = _derived_line(sources.get(side) or {}, revision)
        given = next(
            (
                g
                for block in (path.get("provenance"), report.get("provenance"))
                for key in (side, role)
                if (g := _given(block, key)) is not None
            ),
            None,
        )
        if given is not None:
            executed, line = _executed(given, derived_exec), str(given["summary"])
        else:
            executed, line = derived_exec, derived
        rows.append(
            {
                "path": path.get("id"),
                "side": side,
                "role": role,
                "revision": revision,
                "executed": executed,
                "summary": line,
            }
        )
    return rows


def _tolerance_text(tol: dict[str, Any]) -> str:
    parts = []
    if tol.get("atol") is not None or tol.get("rtol") is not None:
        parts.append(f"|err| <= {tol.get('atol') or 0:g} + {tol.get('rtol') or 0:g} * |reference|")
    if tol.get("min_cosine") is not None:
        parts.append(f"cosine >= {tol['min_cosine']:g}")
    return "; ".join(parts) or "—"


def _metric_rows(path: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per check: set A's, then the stress fixture's (`stress_<check>`, the treatment
    against its reference where the cap, the anchor and the log-ratio guard separate)."""
    stress = path.get("stress") or {}
    checks = {
        **(path.get("checks") or {}),
        **{f"stress_{k}": v for k, v in (stress.get("checks") or {}).items()},
    }
    errors = {
        **(path.get("errors") or {}),
        **{f"stress_{k}": v for k, v in (stress.get("errors") or {}).items()},
    }
    rows = []
    for name, chk in checks.items():
        err = errors.get(name) or {}
        tol = chk.get("tolerance") or {}
        violations = chk.get("violations")
        rows.append(
            {
                "check": f"{path.get('id')}.{name}",
                "max_abs_error": err.get("max_abs_error"),
                "relative_l2_error": err.get("relative_l2_error"),
                "cosine_similarity": err.get("cosine_similarity"),
                "tolerance": _tolerance_text(tol),
                "elementwise_passed": violations == 0 if isinstance(violations, int) else None,
                "violations": violations,
                "cosine_passed": chk.get("cosine_ok")
                if tol.get("min_cosine") is not None
                else None,
                "passed": bool(chk.get("passed")),
            }
        )
    return rows


def _fired_rows(path: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for role, sides in (path.get("fired") or {}).items():
        ours, ref = sides.get("ours") or {}, sides.get("reference") or {}
        rows.append(
            {
                "path": path.get("id"),
                "arm role": role,
                "ours: fraction of loss tokens": ours.get("fraction"),
                "reference: fraction": ref.get("fraction"),
                "ours: tokens": ours.get("tokens"),
                "reference: tokens": ref.get("tokens"),
            }
        )
    return rows


def preflight_summary(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """{"provenance": [...], "metrics": [...], "fired": [...]} or None without a preflight."""
    if not report or not report.get("paths"):
        return None
    paths = [p for p in report["paths"] if isinstance(p, dict)]
    return {
        "provenance": [row for p in paths for row in _provenance(report, p)],
        "metrics": [row for p in paths for row in _metric_rows(p)],
        "fired": [row for p in paths for row in _fired_rows(p)],
    }

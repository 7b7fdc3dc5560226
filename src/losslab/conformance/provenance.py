"""One line per reference side saying what was actually compared against.

Either "executed pinned source <repo>@<commit> (file sha256 <hex>)" or "losslab re-derivation,
pinned source NOT executed" (with why, and the commit the re-derived text came from). The
preflight puts it in its JSON as `provenance[<side>] = {"kind", "summary", ...}` and prints it
first, so a report can never show a passing check without saying which of the two it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def provenance_of(source: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance record of a `ReferenceResult.source`."""
    if source.get("kind") == "pinned_source":
        summary = (
            f"executed pinned source {source.get('repo', '?')}@{source.get('commit', '?')} "
            f"(file sha256 {source.get('file_sha256', '?')})"
        )
        return {
            "kind": "pinned_source",
            "executed": True,
            "summary": summary,
            "repo": source.get("repo"),
            "commit": source.get("commit"),
            "file_sha256": source.get("file_sha256"),
            "obtained": source.get("obtained", "checkout"),
        }
    summary = "losslab re-derivation, pinned source NOT executed"
    details = []
    if source.get("text_commit"):
        details.append(f"formula restated from {source.get('repo', '?')}@{source['text_commit']}")
    if source.get("fallback_reason"):
        details.append(f"why: {source['fallback_reason'].splitlines()[0]}")
    elif source.get("why_not_executed"):
        details.append(f"why: {source['why_not_executed']}")
    if details:
        summary += " (" + "; ".join(details) + ")"
    return {"kind": "rederivation", "executed": False, "summary": summary}

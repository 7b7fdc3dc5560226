"""The report's "What was not done" list: everything a reader could assume happened but did not.

One entry per finding, each {"what": a short category, "detail": one sentence}, from the facts
`report.build.collect` already read:

- **rehearsal**: the run was a `--rehearse` dress rehearsal (toy scale, random model).
- **incomplete run**: why it stopped (the manifest's `stop`, or the failed check) and the
  phases of the table (`manifest.phase_order`) that never finished.
- **re-derived reference**: a preflight side compared against losslab's re-derivation because
  the pinned source was not executed (offline, not cached; `losslab run --source` executes it).
- **overridden check**: a failed check `--force` continued past.
- **skipped audit / check**: a phase the plan turns off (`applicable: false`), a check phase
  whose failures the plan records without stopping, what the generation audit does not check,
  a second grader that could not run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CHECK_ARTIFACTS = {
    "preflight": "correctness preflight",
    "restoration": "restoration preflight",
    "gate": "activation gate",
    "generation_audit": "generation audit",
}
"""facts key -> name, of the check artifacts whose rows and applicability are read here."""


def _entry(what: str, detail: str) -> dict[str, str]:
    return {"what": what, "detail": detail}


def _incomplete(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    status = facts.get("status") or {}
    if status.get("complete"):
        return []
    stop = status.get("stop") or {}
    if status.get("stopped_at"):
        reason = f"stopped at {status['stopped_at']}: {status.get('stop_message') or ''}".strip()
    elif stop:
        reason = f"{stop.get('kind', 'stopped')}: {stop.get('reason', '')}".strip(": ")
    else:
        reason = "in progress, or ended without a recorded reason"
    phases = status.get("phases") or {}
    order = status.get("phase_order") or list(phases)
    missing = [p for p in order if (phases.get(p) or {}).get("status") not in ("done", "forced")]
    out = [_entry("incomplete run", reason)]
    if missing:
        out.append(_entry("phases not run", ", ".join(missing)))
    return out


def _rederived(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    summary = facts.get("preflight_summary") or {}
    return [
        _entry(
            "re-derived reference",
            f"{row.get('path')} {row.get('side')} ({row.get('revision') or '-'}): "
            f"{row.get('summary')}; `losslab run --source OWNER/NAME=PATH` executes it",
        )
        for row in summary.get("provenance") or []
        if not row.get("executed")
    ]


def _overridden(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    out = [
        _entry("overridden check", f"{f.get('phase')}: {f.get('message') or ''}")
        for f in (facts.get("status") or {}).get("forced") or []
    ]
    for key, name in CHECK_ARTIFACTS.items():
        for row in (facts.get(key) or {}).get("checks") or []:
            if row.get("overridden"):
                out.append(
                    _entry(
                        "overridden check",
                        f"{name}: {row.get('check')} measured {row.get('measured')} "
                        f"vs {row.get('bound')} (--force)",
                    )
                )
    return out


def _skipped(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    out = []
    for key, name in CHECK_ARTIFACTS.items():
        art = facts.get(key)
        if not isinstance(art, Mapping):
            continue
        if art.get("applicable") is False:
            out.append(_entry("skipped check", f"{name}: {art.get('note') or 'not applicable'}"))
        elif art.get("passed") and art.get("failures"):
            names = ", ".join(str(f.get("check")) for f in art["failures"])
            out.append(
                _entry(
                    "recorded, not enforced",
                    f"{name}: failed {names}; the plan does not require it to pass",
                )
            )
    audit = facts.get("generation_audit") or {}
    out += [
        _entry("skipped audit", f"generation audit: {x}") for x in audit.get("not_checked") or []
    ]
    grader = facts.get("grader_audit") or {}
    if grader and not grader.get("available", True):
        out.append(_entry("skipped audit", f"second grader: {grader.get('reason')}"))
    return out


def not_done(facts: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every entry of the module docstring that applies to this run, rehearsal first."""
    out = []
    if facts.get("rehearsal"):
        out.append(
            _entry(
                "rehearsal",
                "every phase ran at toy scale on a random model of the plan's architecture; "
                "the verdict is not evidence",
            )
        )
    return out + _incomplete(facts) + _rederived(facts) + _overridden(facts) + _skipped(facts)

"""Build `report.json` and `report.html` from a run directory's artifacts.

The report reads only files (plan.json, manifest.json, the phase artifacts, metrics.jsonl,
eval_<arm>.jsonl, verdict.json), so `losslab report RUN_DIR` rebuilds it at any time, also for
a run that stopped at a failed check (sections not reached say so).

Check artifacts (preflight, restoration, gate, feasibility) share one shape, each phase's
`losslab.checks.PhaseResult.record()`: `{"passed": bool, "applicable": bool, "checks": [{"check",
"measured", "bound", "passed", "note", "overridden"}, ...], "failures": [...], ...}` (rows written
before `note`/`overridden` existed read as empty/false).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from losslab.artifacts import ArtifactError, find_symlink, read_object, read_rows, verify_ledger
from losslab.atomic import atomic_write_json, atomic_write_text
from losslab.report import plots
from losslab.report.audit import grader_audit, power_facts
from losslab.report.efficiency import efficiency_facts
from losslab.report.html import render_html
from losslab.report.items import base_model_facts, flipped_items
from losslab.report.not_done import not_done
from losslab.report.pilot import pilot_diagnostics_facts
from losslab.report.preflight import preflight_summary

REPORT_FORMAT = 1


@dataclass(frozen=True)
class ReportPaths:
    json_path: Path
    html_path: Path


def _read_json(path: Path) -> Any:
    """A JSON object artifact, None when absent; a damaged one raises `ArtifactError`."""
    return read_object(path) if path.is_file() else None


def _read_jsonl(path: Path) -> list[dict[str, Any]] | None:
    """A JSON-lines artifact of objects, None when absent; damage names the file and line."""
    return read_rows(path) if path.is_file() else None


def _switch(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """The arm fields whose values differ between arms (the plan allows exactly one)."""
    keys = sorted({k for a in arms for k in a if k not in ("name", "role")})
    differ = [k for k in keys if len({json.dumps(a.get(k), sort_keys=True) for a in arms}) > 1]
    return {k: {a["name"]: a.get(k) for a in arms} for k in differ}


def _curves(metrics: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, list[list[float]]]]:
    """metric -> arm -> [[step, value], ...] for the report's curve metrics present in the rows."""
    out: dict[str, dict[str, list[list[float]]]] = {}
    for metric in plots.CURVE_METRICS:
        for arm, rows in metrics.items():
            pts = [
                [int(r.get("step", i)), float(r[metric])]
                for i, r in enumerate(rows)
                if isinstance(r.get(metric), int | float)
            ]
            if pts:
                out.setdefault(metric, {})[arm] = pts
    return out


def _accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    k = sum(bool(r.get("correct")) for r in rows)
    return {"n": n, "correct": k, "accuracy": k / n if n else None}


def _paired(
    treatment: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Paired 2x2 counts by item id: b = treatment right & baseline wrong, c = the reverse."""
    t = {str(r.get("id", i)): bool(r.get("correct")) for i, r in enumerate(treatment)}
    b_ = {str(r.get("id", i)): bool(r.get("correct")) for i, r in enumerate(baseline)}
    ids = sorted(set(t) & set(b_))
    if not ids:
        return None
    cells = {"both_right": 0, "b": 0, "c": 0, "both_wrong": 0}
    for i in ids:
        key = {
            (True, True): "both_right",
            (True, False): "b",
            (False, True): "c",
            (False, False): "both_wrong",
        }[(t[i], b_[i])]
        cells[key] += 1
    return {"n": len(ids), **cells, "unpaired_items": len(set(t) ^ set(b_))}


BASE_EVAL_FILE = "eval_base_model.jsonl"
"""The initial policy's evaluation (losslab.runner.rundir.RunDir.base_eval_path)."""


def _units(schedule: dict[str, Any], arm_names: list[str]) -> dict[str, dict[str, Any]]:
    """Trained unit -> {"arm": plan arm, "seed": seed}; with one seed every unit is a plan arm."""
    recorded = schedule.get("units") or {}
    seeds = schedule.get("seeds") or {}
    return {
        a: {"arm": (recorded.get(a) or {}).get("arm", a), "seed": seeds.get(a)} for a in arm_names
    }


def _measured_seconds(manifest: dict[str, Any]) -> float:
    return float(sum(float(p.get("seconds") or 0.0) for p in manifest.get("phases", {}).values()))


def _status(manifest: dict[str, Any]) -> dict[str, Any]:
    phases = manifest.get("phases", {})
    failed = [(k, v) for k, v in phases.items() if v.get("status") == "failed"]
    forced = [
        {"phase": k, "message": v.get("message")}
        for k, v in phases.items()
        if v.get("status") == "forced"
    ]
    complete = phases.get("decision", {}).get("status") == "done"
    return {
        "complete": complete,
        "stopped_at": failed[0][0] if failed else None,
        "stop_message": failed[0][1].get("message") if failed else None,
        "forced": forced,
        "force_flag": bool(manifest.get("force")),
        "resumed": manifest.get("resumed", []),
        "phases": phases,
        "stop": manifest.get("stop"),  # why an incomplete run ended (the runner's record)
        "phase_order": manifest.get("phase_order") or [],
    }


def _refuse_damage(run_dir: Path, manifest: dict[str, Any]) -> None:
    """A report never shows numbers from a cut or edited artifact (an eval file cut to 5 rows
    beside a 24-item verdict): each file of the manifest's ledger must match it, and the folder
    holds no symbolic link."""
    link = find_symlink(run_dir)
    if link is not None:
        raise ArtifactError(link, "it is a symbolic link (losslab writes none); remove it")
    damaged = verify_ledger(run_dir, manifest)
    if damaged:
        path, why = damaged[0]
        raise ArtifactError(path, f"{why}; `losslab run PLAN --resume {run_dir}` recomputes it")


def collect(run_dir: Path) -> dict[str, Any]:
    """Every fact the report shows, as one JSON-safe dict (the content of report.json)."""
    run_dir = Path(run_dir)
    manifest = _read_json(run_dir / "manifest.json")
    if manifest is None:
        raise FileNotFoundError(f"{run_dir} is not a losslab run directory: no manifest.json")
    phases = manifest.get("phases", {})
    if not isinstance(phases, dict) or not all(isinstance(v, dict) for v in phases.values()):
        raise ArtifactError(run_dir / "manifest.json", "'phases' is not an object of objects")
    _refuse_damage(run_dir, manifest)
    plan = _read_json(run_dir / "plan.json") or {}
    schedule = manifest.get("schedule", {})
    arms_plan = [a for a in plan.get("arms", []) if isinstance(a, dict)]
    arm_names = schedule.get("arms") or [a.get("name") for a in arms_plan]
    treatment = schedule.get("treatment")
    units = _units(schedule, arm_names)
    roles = {a.get("name"): a.get("role") for a in arms_plan if a.get("role")}
    if treatment:
        roles.setdefault(units.get(treatment, {"arm": treatment})["arm"], "treatment")
    for unit, info in units.items():  # a seed replica has the role of its plan arm
        if info["arm"] in roles:
            roles[unit] = roles[info["arm"]]
    if treatment:
        for a in arm_names:
            roles.setdefault(a, "baseline")
    treatment_seed = units.get(treatment, {}).get("seed") if treatment else None
    baselines = [a for a in arm_names if roles.get(a) == "baseline"]
    same_seed = [a for a in baselines if units[a]["seed"] == treatment_seed]
    baseline = (same_seed or baselines or [None])[0]

    metrics = {a: _read_jsonl(run_dir / "arms" / a / "metrics.jsonl") or [] for a in arm_names}
    evals = {a: _read_jsonl(run_dir / f"eval_{a}.jsonl") for a in arm_names}
    evaluation = {a: _accuracy(rows) for a, rows in evals.items() if rows is not None}
    paired = None
    if treatment and baseline and evals.get(treatment) and evals.get(baseline):
        paired = _paired(evals[treatment], evals[baseline])
        if paired is not None:
            paired.update({"treatment": treatment, "baseline": baseline})

    base_rows = _read_jsonl(run_dir / BASE_EVAL_FILE)
    alpha = float((plan.get("decision_rule") or {}).get("alpha") or 0.05)
    present = {a: rows for a, rows in evals.items() if rows is not None}

    feasibility = _read_json(run_dir / "feasibility.json")
    budget = plan.get("budget") or {}
    pilot = manifest.get("phases", {}).get("pilot", {})
    return {
        "format": REPORT_FORMAT,
        "title": plan.get("title"),
        "rehearsal": manifest.get("rehearsal"),
        "hypothesis": plan.get("hypothesis"),
        "success_criterion": plan.get("success_criterion"),
        "base_model": plan.get("base_model"),
        "arms": [{**a, "role": roles.get(a.get("name"))} for a in arms_plan],
        "switch": _switch(arms_plan),
        "loss_code": manifest.get("loss_code") or {},  # arms whose loss is code: file, sha256
        "status": _status(manifest),
        "schedule": schedule,
        "pilot": {
            "arm": pilot.get("arm", treatment),
            "steps": pilot.get("steps", schedule.get("pilot_steps")),
            "reused_by_treatment": True,
            "note": (
                f"The pilot is the first {schedule.get('pilot_steps')} steps of the treatment arm "
                f"{treatment} with the same seeds; the treatment arm continued from the pilot's "
                "checkpoint instead of repeating them."
            ),
        },
        "preflight": (preflight := _read_json(run_dir / "preflight.json")),
        "preflight_summary": preflight_summary(preflight),
        "restoration": _read_json(run_dir / "restoration.json"),
        "gate": _read_json(run_dir / "pilot" / "gate.json"),
        "pilot_diagnostics": pilot_diagnostics_facts(run_dir),
        "executed_config": _read_json(run_dir / "executed_config.json"),
        "feasibility": {
            "artifact": feasibility,
            "measured_wall_seconds": _measured_seconds(manifest),
            "budget": budget,
        },
        "training": {"curves": _curves(metrics), "steps": {a: len(r) for a, r in metrics.items()}},
        "evaluation": evaluation,
        "base_evaluation": base_model_facts(base_rows, present, alpha),
        "paired": paired,
        "units": units,
        "flipped": flipped_items(present, base_rows, units, roles),
        "verdict": (verdict := _read_json(run_dir / "verdict.json")),
        "power": power_facts(plan, verdict),
        "grader_audit": grader_audit(present),
        "generation_audit": _read_json(run_dir / "generation_audit.json"),
        "efficiency": efficiency_facts(metrics, base_rows),
        "environment": {
            **(manifest.get("environment") or {}),
            "losslab_version": manifest.get("losslab_version"),
            "plan_sha256": manifest.get("plan_sha256"),
            "backend": manifest.get("backend"),
            "seeds": schedule.get("seeds"),
            "created_at": manifest.get("created_at"),
        },
    }


def _projected_minutes(facts: dict[str, Any]) -> float | None:
    art = facts["feasibility"]["artifact"] or {}
    for key in ("projected_wall_seconds", "wall_seconds"):
        v = art.get(key)
        if isinstance(v, int | float):
            return float(v) / 60.0
    return None


def figures(facts: dict[str, Any]) -> dict[str, tuple[str, bytes]]:
    """Plot id -> (caption, PNG bytes) for every figure the facts support."""
    out: dict[str, tuple[str, bytes]] = {}
    for metric, series in facts["training"]["curves"].items():
        pid = "curve-" + metric.replace("/", "-").replace("_", "-")
        out[pid] = (f"training curve: {metric}", plots.curve_png(metric, series))
    acc = {}
    base = facts.get("base_evaluation") or {}
    if base.get("accuracy") is not None:
        acc[plots.BASE_LABEL] = (base["accuracy"], base["correct"], base["n"])
    acc.update(
        {
            a: (e["accuracy"], e["correct"], e["n"])
            for a, e in facts["evaluation"].items()
            if e["accuracy"] is not None
        }
    )
    if acc:
        out["eval-accuracy"] = ("evaluation accuracy per arm", plots.accuracy_png(acc))
    eff = facts.get("efficiency") or {}
    if eff.get("units"):
        series = {u: c["points"] for u, c in eff["units"].items()}
        caption = "accuracy vs training tokens (efficiency endpoint)"
        out["efficiency"] = (caption, plots.efficiency_png(series))
    minutes: dict[str, float] = {}
    projected = _projected_minutes(facts)
    if projected is not None:
        minutes["projected"] = projected
    minutes["measured"] = facts["feasibility"]["measured_wall_seconds"] / 60.0
    budget = facts["feasibility"]["budget"].get("max_wall_minutes")
    if isinstance(budget, int | float):
        minutes["budget"] = float(budget)
    out["feasibility"] = ("feasibility (wall minutes)", plots.feasibility_png(minutes))
    return out


def build_report(run_dir: Path) -> ReportPaths:
    """Write report.json and report.html into `run_dir`; returns their paths."""
    run_dir = Path(run_dir)
    facts = collect(run_dir)
    facts["not_done"] = not_done(facts)
    figs = figures(facts)
    facts["plots"] = {pid: caption for pid, (caption, _) in figs.items()}
    json_path, html_path = run_dir / "report.json", run_dir / "report.html"
    atomic_write_json(json_path, facts, indent=2, sort_keys=True, default=str)
    images = {pid: (cap, base64.b64encode(png).decode()) for pid, (cap, png) in figs.items()}
    atomic_write_text(html_path, render_html(facts, images))
    return ReportPaths(json_path, html_path)

"""The report's pilot-diagnostics section, from pilot/diagnostics.json (`runner.phases.pilot`).

What it answers, before the verdict is read: did sampler and trainer agree before any update
(mean and max |log p - log q|, Pearson, the alignment check), did the trust region act because
of that numeric mismatch or because the policy moved (each metric at the first minibatch update,
mismatch only, beside the last, mismatch + drift), how many completions each group really had
(duplicates, effective group size against the plan's), the seed each component used, and the
policy-gradient part's gradient norm.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from losslab.artifacts import read_object
from losslab.report.cells import cell

DIAGNOSTICS_FILE = Path("pilot") / "diagnostics.json"


def pilot_diagnostics_facts(run_dir: Path) -> dict[str, Any] | None:
    """The run's pilot diagnostics, None when the pilot did not reach them."""
    path = Path(run_dir) / DIAGNOSTICS_FILE
    return read_object(path) if path.is_file() else None


def _fmt(value: Any) -> str:
    return cell(value, digits=4, list_brackets=False)  # a diagnostics row: short, unbracketed


def _table(header: list[str], rows: list[list[Any]], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def _mismatch(d: dict[str, Any]) -> str:
    m, check = d["mismatch"], d.get("alignment") or {}
    rows = [
        ["mean |log p - log q|", m.get("abs_logprob_mean")],
        ["max |log p - log q|", m.get("abs_logprob_max")],
        ["Pearson(log p, log q), lowest pilot step", m.get("pearson_min")],
        ["mean(log q - log p) (kl_sample_train_v1)", m.get("kl_sample_train_v1")],
        ["loss tokens compared", m.get("tokens")],
        [
            "mean |d| with q one position early / late",
            [m.get("abs_logprob_mean_shift_minus1"), m.get("abs_logprob_mean_shift_plus1")],
        ],
    ]
    verdict = "pass" if check.get("passed") else "FAIL"
    css = "pass" if check.get("passed") else "fail"
    note = (
        f'<p>Alignment (ratio is 1 at the trained positions): <span class="{css}">{verdict}'
        f"</span>, measured {escape(_fmt(check.get('measured')))}, bound "
        f"{escape(str(check.get('bound')))}; {escape(str(check.get('note') or ''))}</p>"
    )
    return (
        f'<p class="muted">Measured at {escape(str(m.get("measured_at")))}.</p>'
        + _table(["sampler vs trainer, before any update", "value"], rows, "pilot-mismatch")
        + note
    )


def _trust_region(d: dict[str, Any]) -> str:
    rows = d.get("trust_region") or []
    if not rows:
        return '<p class="muted">No trust-region metric was logged.</p>'
    last = rows[0].get("last_update")
    header = [
        "metric",
        "logged key",
        "update 1: mismatch only",
        f"update {last}: mismatch + drift",
        "mismatch share",
        "what made it act",
    ]
    body = [
        [
            r["metric"],
            r["key"],
            r["mismatch_only"],
            r["mismatch_and_drift"],
            r["mismatch_share"],
            r["acted_because"],
        ]
        for r in rows
    ]
    return (
        '<p class="muted">Update 1 of each pilot step runs on the sampler snapshot\'s weights, '
        "so whatever acts there acts on numeric mismatch alone; the last update follows "
        "optim steps, so it adds the policy's drift. Fractions count tokens with A != 0 "
        "(Stable-RL's pg_clipfrac), means over the pilot steps.</p>"
        + _table(header, body, "pilot-mismatch-vs-drift")
    )


def _groups(d: dict[str, Any]) -> str:
    g = d["groups"]
    rows = [
        ["planned group size G", g.get("planned_group_size")],
        ["effective group size (distinct completions), mean", g.get("effective_group_size_mean")],
        ["effective group size, smallest group", g.get("effective_group_size_min")],
        ["duplicate completions (pilot total)", g.get("duplicate_completions")],
        ["groups whose completions are all one sequence", g.get("groups_all_identical")],
    ]
    warn = ""
    if g.get("below_plan"):
        warn = (
            '<p class="banner warn">The effective group size is below the plan\'s: some '
            "groups hold token-identical completions. At low entropy that is expected; groups "
            "of identical long completions point at a sampler that ignored its seed.</p>"
        )
    return warn + _table(["GRPO groups", "value"], rows, "pilot-groups")


def _grad_and_seeds(d: dict[str, Any]) -> str:
    gn, last = d.get("grad_norm") or {}, (d.get("trust_region") or [{}])[0].get("last_update")
    grads = [
        ["policy-gradient part |dL_pg/dl|", gn.get("pg_update1"), gn.get("pg_last_update")],
        ["whole loss |dL/dl|", gn.get("total_update1"), gn.get("total_last_update")],
    ]
    seeds = d.get("seeds") or {}
    seed_rows = [[k.replace("_", " "), v] for k, v in seeds.items()]
    return _table(
        ["gradient norm w.r.t. log-probs", "update 1", f"update {last or 'last'}"],
        grads,
        "pilot-grad-norm",
    ) + _table(["component", "seed used"], seed_rows, "pilot-seeds")


def pilot_section(d: dict[str, Any] | None) -> str:
    """The section's HTML body (without its heading)."""
    if d is None:
        return '<p class="muted">The pilot did not reach its diagnostics in this run.</p>'
    if not d.get("available"):
        return f'<p class="muted">{escape(str(d.get("reason") or "not available"))}</p>'
    return _mismatch(d) + _trust_region(d) + _groups(d) + _grad_and_seeds(d)

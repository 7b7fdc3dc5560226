"""One self-contained HTML page: inline CSS, images as base64 PNG, no network request.

A short inline script marks every plot `data-rendered="yes"` once the browser decoded it (or
"no" when it failed), and sets `data-plots-rendered="k/n"` on <body>, plus counts of what the
browser parsed (`data-base-row`, `data-provenance-lines`, `data-provenance-warnings`,
`data-flipped-items`); the Chromium test reads those attributes from the dumped DOM.
"""

from __future__ import annotations

from html import escape
from typing import Any

from losslab.report.cells import cell
from losslab.report.pilot import pilot_section

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}.pass{color:#16794a;font-weight:600}.fail{color:#b3261e;font-weight:600}
.banner{padding:.7em 1em;border-radius:6px;margin:1em 0}.ok{background:#e8f5ec}
.stop{background:#fdecea}.warn{background:#fff4e0}
.verdict{font-size:1.35em;font-weight:700}.muted{color:#666;font-size:.9em}
.plots{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}figcaption{font-size:.85em;color:#555}
code{background:#f4f4f4;padding:0 .2em}
.provenance{list-style:none;padding:0}.provenance li{padding:.35em .7em;border-radius:5px;margin:.3em 0}
.provenance li.executed{background:#e8f5ec}.provenance li.not-executed{background:#fff4e0;
border-left:4px solid #e69500}
details.flip{border:1px solid #ddd;border-radius:5px;margin:.3em 0;padding:.2em .6em}
details.flip>summary{cursor:pointer}pre.completion{white-space:pre-wrap;margin:0;font-size:1em}
tr.base-row td{background:#f6f6fb}
"""

_SCRIPT = """
(function(){
  function mark(){
    var imgs=document.querySelectorAll('img.plot');var ok=0;
    imgs.forEach(function(im){var r=im.complete&&im.naturalWidth>0;
      im.setAttribute('data-rendered',r?'yes':'no');if(r){ok++;}});
    document.body.setAttribute('data-plots-rendered',ok+'/'+imgs.length);
    var b=document.body,q=function(sel){return document.querySelectorAll(sel).length;};
    b.setAttribute('data-base-row',q('#evaluation-table tr.base-row'));
    b.setAttribute('data-provenance-lines',q('#provenance li'));
    b.setAttribute('data-provenance-warnings',q('#provenance li.not-executed'));
    b.setAttribute('data-flipped-items',q('#flipped details.flip'));
  }
  if(document.readyState==='complete'){mark();}else{window.addEventListener('load',mark);}
})();
"""


def _cell(value: Any) -> str:
    return f"<td>{escape(cell(value))}</td>"


def _passed_cell(passed: Any) -> str:
    if passed is None:
        return "<td>—</td>"
    return '<td class="pass">pass</td>' if passed else '<td class="fail">FAIL</td>'


def _kv_table(d: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> str:
    if not d:
        return '<p class="muted">not recorded</p>'
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th>{_cell(v)}</tr>" for k, v in d.items() if k not in skip
    )
    return f"<table>{rows}</table>"


def _check_note(row: dict[str, Any]) -> str:
    """A check row's note, saying so when `--force` overrode it (`losslab.checks.Check`)."""
    note = str(row.get("note") or "")
    if row.get("overridden"):
        return f"{note}; overridden by --force" if note else "overridden by --force"
    return note


def _checks_table(artifact: dict[str, Any] | None, what: str) -> str:
    if artifact is None:
        return f'<p class="muted">{escape(what)} was not reached in this run.</p>'
    checks = artifact.get("checks") or []
    head = (
        f'<p>Result: <span class="{"pass" if artifact.get("passed") else "fail"}">'
        f"{'passed' if artifact.get('passed') else 'FAILED'}</span></p>"
    )
    if not checks:
        return head + _kv_table(artifact, skip=("passed", "failures", "checks"))
    rows = "".join(
        "<tr>"
        + _cell(c.get("check"))
        + _cell(c.get("measured"))
        + _cell(c.get("bound"))
        + _passed_cell(c.get("passed"))
        + _cell(_check_note(c))
        + "</tr>"
        for c in checks
    )
    return (
        head
        + "<table><tr><th>check</th><th>measured</th><th>bound</th><th>result</th>"
        + f"<th>note</th></tr>{rows}</table>"
    )


def _status_banner(status: dict[str, Any]) -> str:
    parts = []
    if status.get("stopped_at"):
        parts.append(
            f'<div class="banner stop" id="status"><b>Stopped at {escape(status["stopped_at"])}.'
            f"</b> {escape(status.get('stop_message') or '')}</div>"
        )
    elif status.get("complete"):
        parts.append('<div class="banner ok" id="status">Run complete: every phase ran.</div>')
    elif status.get("stop"):
        stop = status["stop"]
        during = f" during {stop['phase']}" if stop.get("phase") else ""
        parts.append(
            f'<div class="banner warn" id="status"><b>Run incomplete: {escape(str(stop.get("kind")))}'
            f"{escape(during)}.</b> {escape(str(stop.get('reason') or ''))}; sections not "
            "reached are marked.</div>"
        )
    else:
        parts.append(
            '<div class="banner warn" id="status">Run incomplete (in progress, or ended with '
            "no recorded reason); sections not reached are marked.</div>"
        )
    for f in status.get("forced") or []:
        parts.append(
            f'<div class="banner warn forced"><b>--force overrode a failed check in '
            f"{escape(f['phase'])}:</b> {escape(f.get('message') or '')}</div>"
        )
    if status.get("resumed"):
        parts.append(
            f'<p class="muted">Resumed {len(status["resumed"])} time(s): '
            f"{escape(', '.join(status['resumed']))}</p>"
        )
    return "".join(parts)


def _rederived_banner(summary: dict[str, Any] | None) -> str:
    """A warning whenever a pinned source was not executed (its re-derivation was compared)."""
    rows = [r for r in (summary or {}).get("provenance") or [] if not r.get("executed")]
    if not rows:
        return ""
    items = "".join(
        f"<li>{escape(str(r.get('path')))} {escape(str(r.get('side')))}: "
        f"{escape(str(r.get('summary')))}</li>"
        for r in rows
    )
    return (
        '<div class="banner warn" id="rederived"><b>Pinned source NOT executed.</b> The '
        "correctness preflight compared against losslab's re-derivation of these references; "
        "`losslab run --source OWNER/NAME=PATH` executes the pinned commit from a checkout."
        f"<ul>{items}</ul></div>"
    )


def _not_done(entries: list[dict[str, str]] | None) -> str:
    if not entries:
        return (
            "<p>Nothing: every phase ran, every pinned source was executed, no check was "
            "overridden and no audit was skipped.</p>"
        )
    rows = "".join(f"<li><b>{escape(e['what'])}</b>: {escape(e['detail'])}</li>" for e in entries)
    return f"<ul id='not-done-list'>{rows}</ul>"


def _efficiency(eff: dict[str, Any] | None, images: dict[str, tuple[str, str]]) -> str:
    if not eff:
        return '<p class="muted">off (the plan sets no engine.eval_every)</p>'
    rows = [
        {
            "unit": unit,
            "points": len(c["points"]),
            "items": c["items"],
            "tokens at the last point": c["points"][-1][0],
            "area (accuracy x tokens)": c["area"],
            "mean accuracy over tokens": c["mean_accuracy"],
            "starts at the base model": c["starts_at_base_model"],
        }
        for unit, c in eff["units"].items()
    ]
    return (
        f'<p class="muted">{escape(eff["note"])}</p>'
        + _rows_table(rows)
        + _img("efficiency", images)
    )


def _generation_audit(audit: dict[str, Any] | None) -> str:
    if audit is None:
        return '<p class="muted">The generation audit was not reached in this run.</p>'
    out = [_checks_table(audit, "The generation audit")]
    overlap = audit.get("overlap") or {}
    if overlap.get("overlap_ids"):
        ids = ", ".join(map(str, overlap["overlap_ids"][:50]))
        out.append(f"<p>Test items whose question is also a training question: {escape(ids)}</p>")
    if not audit.get("required"):
        out.append(
            '<p class="muted">generation_audit.required is false: a failed row is recorded '
            "here and does not stop the run.</p>"
        )
    return "".join(out)


def _ci_text(ci: Any) -> str:
    if (
        isinstance(ci, list | tuple)
        and len(ci) == 2
        and all(isinstance(x, int | float) for x in ci)
    ):
        return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"
    return cell(ci)


def _secondary_table(secondary: dict[str, Any]) -> str:
    rows = []
    for name, a in secondary.items():
        if not isinstance(a, dict):
            rows.append({"analysis": name, "estimate": a})
            continue
        rows.append(
            {
                "analysis": name,
                "estimate": a.get("estimate"),
                "interval": _ci_text(a.get("ci")),
                "p-value": a.get("p_value"),
                "note": a.get("note") or "",
            }
        )
    return _rows_table(rows)


def _verdict(verdict: dict[str, Any] | None) -> str:
    if verdict is None:
        return (
            '<p class="verdict" id="verdict-text">No verdict: the run did not reach the '
            "decision rule.</p>"
        )
    headline = verdict.get("verdict")
    body = f'<p class="verdict" id="verdict-text">Verdict: {escape(cell(headline))}</p>'
    if verdict.get("statement"):
        body += f"<p>{escape(str(verdict['statement']))}</p>"
    crit = verdict.get("criterion") if isinstance(verdict.get("criterion"), dict) else {}
    means = verdict.get("arm_means") if isinstance(verdict.get("arm_means"), dict) else {}
    arms = crit.get("arms") if isinstance(crit.get("arms"), dict) else {}
    facts: dict[str, Any] = {
        "estimate": verdict.get("estimate"),
        f"{cell(verdict.get('confidence'))} interval": _ci_text(verdict.get("ci")),
        "method": verdict.get("method"),
        "items (n)": verdict.get("n"),
        "half-width": verdict.get("half_width"),
        "margin": crit.get("margin"),
        "metric": crit.get("metric"),
        "weights": crit.get("weights"),
    }
    for role, mean in means.items():
        facts[f"mean {role} ({arms.get(role, role)})"] = mean
    facts["estimand"] = verdict.get("estimand")
    known = {
        "statement",
        "criterion",
        "arm_means",
        "estimate",
        "ci",
        "method",
        "n",
        "half_width",
        "confidence",
        "estimand",
        "secondary",
        "criteria",
        "verdict",
        "per_seed",
        "pooled",
        "seeds",
    }
    facts.update(
        {k: v for k, v in verdict.items() if k not in known and not isinstance(v, dict | list)}
    )
    body += _kv_table({k: v for k, v in facts.items() if v is not None})
    body += _seeds(verdict)
    if isinstance(verdict.get("secondary"), dict) and verdict["secondary"]:
        body += "<h3>Secondary analyses (reported, not deciding)</h3>"
        body += _secondary_table(verdict["secondary"])
    criteria = verdict.get("criteria")
    if isinstance(criteria, list) and len(criteria) > 1:
        body += "<h3>All criteria</h3>" + _rows_table(
            [
                {
                    k: (_ci_text(c.get(k)) if k == "ci" else c.get(k))
                    for k in ("id", "metric", "estimate", "ci", "margin", "verdict")
                }
                for c in criteria
                if isinstance(c, dict)
            ]
        )
    return body


def _loss_code(code: dict[str, Any] | None) -> str:
    """One line per arm whose loss is code: "your code: my_dppo.py::fn @ sha256 3f2a..." (the
    file the preflight checked and the arm trained; manifest.json's `loss_code`)."""
    if not code:
        return ""
    items = "".join(
        f'<li data-arm="{escape(arm)}"><b>{escape(arm)}</b>: {escape(str(rec.get("summary")))} '
        f'<span class="muted">sha256 {escape(str(rec.get("sha256")))}</span></li>'
        for arm, rec in code.items()
    )
    return f'<h3>Losses named as code</h3><ul id="loss-code">{items}</ul>'


def _preflight(artifact: dict[str, Any] | None, summary: dict[str, Any] | None) -> str:
    """Provenance line per side (a warning when the pinned source was not executed), each error
    with its tolerance and per-metric result, and the fired fractions; else the checks table."""
    if artifact is None or summary is None:
        return _checks_table(artifact, "The correctness preflight")
    passed = artifact.get("passed")
    out = [
        f'<p>Result: <span class="{"pass" if passed else "fail"}">'
        f"{'passed' if passed else 'FAILED'}</span></p>",
        '<h3>Where each reference came from</h3><ul class="provenance" id="provenance">',
    ]
    for row in summary["provenance"]:
        cls = "executed" if row["executed"] else "not-executed"
        mark = "" if row["executed"] else "<b>WARNING:</b> "
        out.append(
            f'<li class="{cls}" data-side="{escape(row["side"])}">{mark}'
            f"<b>{escape(row['role'])} side ({escape(str(row['path']))})</b>: "
            f"{escape(row['summary'])}</li>"
        )
    out.append("</ul>")
    if not all(r["executed"] for r in summary["provenance"]):
        out.append(
            '<p class="muted">A re-derivation checks losslab against its own reading of the '
            "reference's formula. Pass <code>--source owner/repo=PATH</code> (a checkout of the "
            "pinned repository) to execute the pinned source instead.</p>"
        )
    metric_rows = "".join(
        "<tr>"
        + _cell(m["check"])
        + _cell(_sci(m["max_abs_error"]))
        + _cell(_sci(m["relative_l2_error"]))
        + _cell(_cos(m["cosine_similarity"]))
        + _cell(m["tolerance"])
        + _passed_cell(m["elementwise_passed"])
        + _passed_cell(m["cosine_passed"])
        + _passed_cell(m["passed"])
        + "</tr>"
        for m in summary["metrics"]
    )
    out.append(
        '<h3>Errors against tolerances</h3><table id="preflight-errors"><tr><th>check</th>'
        "<th>max |error|</th><th>relative L2 error</th><th>cosine</th><th>tolerance</th>"
        "<th>elementwise</th><th>cosine</th><th>result</th></tr>"
        f"{metric_rows}</table>"
    )
    if summary["fired"]:
        out.append("<h3>Clip/mask fired on the fixture (share of loss tokens)</h3>")
        out.append(
            _rows_table(
                [
                    {k: (_pct(v) if "fraction" in k else v) for k, v in r.items()}
                    for r in summary["fired"]
                ]
            )
        )
    rows = artifact.get("checks") or []
    properties = [c for c in rows if str(c.get("check")).startswith("properties.")]
    if properties:  # conformance.properties, docs/properties.md
        passed = all(c.get("passed") for c in properties)
        out.append("<h3>Property checks of every arm's loss</h3>")
        out.append(_checks_table({"checks": properties, "passed": passed}, "The property checks"))
    return "".join(out)


def _sci(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else "—"


def _cos(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, int | float) else "—"


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, int | float) else "—"


def _seeds(verdict: dict[str, Any]) -> str:
    """Per-seed verdicts and the pooled two-way interval of a several-seed run."""
    per_seed = verdict.get("per_seed")
    if not isinstance(per_seed, list) or not per_seed:
        return ""
    rows = [
        {
            "seed": r.get("seed"),
            "estimate": r.get("estimate"),
            "interval (plan's rule)": _ci_text(r.get("ci")),
            "verdict": r.get("verdict"),
            **{f"mean {k}": v for k, v in (r.get("arm_means") or {}).items()},
        }
        for r in per_seed
    ]
    body = (
        '<h3 id="per-seed">Per-seed verdicts (reported; the plan\'s rule decides on the '
        "seed-averaged items above)</h3>" + _rows_table(rows)
    )
    pooled = verdict.get("pooled")
    if isinstance(pooled, dict):
        det = pooled.get("details") or {}
        body += (
            '<h3 id="pooled">Pooled over seeds (reported, not deciding)</h3>'
            f'<p id="pooled-text">{escape(str(pooled.get("method")))}: estimate '
            f"{cell(pooled.get('estimate'))}, {cell(1 - float(pooled.get('alpha', 0.05)))} "
            f"interval {_ci_text(pooled.get('ci'))} (t with {cell(det.get('df'))} df, se "
            f"{cell(det.get('se'))}, {cell(det.get('seeds'))} seeds x {cell(det.get('items'))} "
            f"items){escape('; ' + pooled['note'] if pooled.get('note') else '')}.</p>"
            f"<p class='muted'>{escape(str(pooled.get('why') or ''))}</p>"
        )
    return body


def _evaluation_table(facts: dict[str, Any]) -> str:
    """One row per evaluated unit plus the base model's, with each arm's change vs base."""
    ev = facts.get("evaluation") or {}
    base = facts.get("base_evaluation") or {}
    vs = base.get("versus_base") or {}
    head = (
        "<tr><th>policy</th><th>items</th><th>correct</th><th>accuracy</th>"
        "<th>change vs base model</th><th>interval (paired Hoeffding, reported)</th>"
        "<th>b / c vs base</th></tr>"
    )
    rows = []
    if base:
        rows.append(
            '<tr class="base-row" id="base-row"><td>base model (initial policy, shared by '
            "every arm)</td>"
            + _cell(base.get("n"))
            + _cell(base.get("correct"))
            + _cell(base.get("accuracy"))
            + "<td>—</td><td>—</td><td>—</td></tr>"
        )
    for unit, e in ev.items():
        d = vs.get(unit) or {}
        change = f"{d['estimate']:+.4f}" if isinstance(d.get("estimate"), int | float) else "—"
        bc = f"{d['b']} / {d['c']}" if "b" in d else "—"
        rows.append(
            "<tr>"
            + _cell(unit)
            + _cell(e.get("n"))
            + _cell(e.get("correct"))
            + _cell(e.get("accuracy"))
            + f'<td class="vs-base">{escape(change)}</td>'
            + _cell(_ci_text(d.get("ci")) if d else None)
            + _cell(bc)
            + "</tr>"
        )
    note = ""
    if base:
        note = (
            "<p class='muted'>The base model is the initial policy (both arms start from these "
            "weights), evaluated once on the same items. Change vs base = arm accuracy minus base "
            "accuracy over the paired items; b = arm right and base wrong, c = the reverse. "
            "Reported, not deciding.</p>"
        )
        if base.get("versus_base_error"):
            note += f"<p class='fail'>{escape(base['versus_base_error'])}</p>"
    else:
        note = "<p class='muted'>The base model was not evaluated in this run.</p>"
    return f'<table id="evaluation-table">{head}{"".join(rows)}</table>{note}'


def _answer_cells(view: dict[str, Any] | None) -> str:
    if view is None:
        return "<td>—</td><td>—</td><td>—</td>"
    grade = "right" if view.get("correct") else "wrong"
    cls = "pass" if view.get("correct") else "fail"
    return (
        f'<td><pre class="completion">{escape(str(view.get("completion") or ""))}</pre></td>'
        + _cell(view.get("prediction"))
        + f'<td class="{cls}">{grade}</td>'
    )


def _flipped(groups: list[dict[str, Any]] | None) -> str:
    if not groups:
        return '<p class="muted">not reached (no paired evaluation yet)</p>'
    out = []
    for g in groups:
        t, b = str(g["treatment"]), str(g["baseline"])
        seed = f" (seed {g['seed']})" if len(groups) > 1 else ""
        kinds = {
            "b": [i for i in g["items"] if i["kind"] == "b"],
            "c": [i for i in g["items"] if i["kind"] == "c"],
        }
        out.append(
            f"<h3>{escape(t)} vs {escape(b)}{escape(seed)}: {len(g['items'])} discordant "
            f"items (b = {len(kinds['b'])}, c = {len(kinds['c'])})</h3>"
        )
        for kind, label in (("b", f"{t} right, {b} wrong"), ("c", f"{b} right, {t} wrong")):
            items = kinds[kind]
            out.append(
                f'<details class="flip-group" data-kind="{kind}"><summary><b>{kind} = '
                f"{len(items)}</b>: {escape(label)}</summary>"
            )
            for it in items:
                question = str(it.get("question") or "")
                short = question if len(question) <= 110 else question[:107] + "..."
                rows = [
                    "<tr><th>policy</th><th>completion</th><th>extracted answer</th>"
                    "<th>grade</th></tr>",
                    f"<tr><td>{escape(t)}</td>{_answer_cells(it.get('treatment'))}</tr>",
                    f"<tr><td>{escape(b)}</td>{_answer_cells(it.get('baseline'))}</tr>",
                ]
                if it.get("base_model") is not None:
                    rows.append(
                        f"<tr><td>base model</td>{_answer_cells(it.get('base_model'))}</tr>"
                    )
                out.append(
                    f'<details class="flip" data-item="{escape(str(it["id"]))}"><summary>'
                    f"<code>{escape(str(it['id']))}</code> {escape(short)}</summary>"
                    f"<p><b>Question:</b> {escape(question) or '—'}</p>"
                    f"<p><b>Reference answer:</b> <code>{escape(cell(it.get('answer')))}</code></p>"
                    f"<table>{''.join(rows)}</table></details>"
                )
            out.append("</details>")
    out.append(
        "<p class='muted'>Collapsed sections open when the browser's find (Ctrl-F) matches text "
        "inside them. Every item, flipped or not, is in <code>eval_&lt;arm&gt;.jsonl</code>.</p>"
    )
    return "".join(out)


def _power(power: dict[str, Any] | None) -> str:
    if not power:
        return '<p class="muted">no decision rule with an eval size in the plan</p>'
    lines = [line for p in power["assumed"] for line in p["lines"]]
    out = f"<pre id='power-assumed'>{escape(chr(10).join(lines))}</pre>"
    if power.get("measured"):
        lines = [line for p in power["measured"] for line in p["lines"]]
        out += (
            "<p>At the discordance the final evaluation measured (share of items the arms "
            f"disagree on):</p><pre id='power-measured'>{escape(chr(10).join(lines))}</pre>"
        )
    else:
        out += '<p class="muted">no measured discordance (no binary paired evaluation yet)</p>'
    return out


def _grader_audit(audit: dict[str, Any] | None) -> str:
    from losslab.report.audit import MAX_LISTED, audit_rows

    if not audit or not audit.get("available"):
        reason = (audit or {}).get("reason", "not run")
        return f'<p class="muted">not run: {escape(str(reason))}</p>'
    out = [
        f"<p>{escape(audit['grader'])} re-grades every evaluated completion with its own "
        "extraction and equivalence check; listed are the items where it disagrees with the "
        "recorded grade. It changes no grade and not the verdict.</p>"
    ]
    for unit, facts in audit["units"].items():
        found = facts["disagreements"]
        out.append(f"<h3>{escape(str(unit))}: {len(found)} of {facts['items']} items disagree</h3>")
        if found:
            out.append(_rows_table(audit_rows(facts)))
            if len(found) > MAX_LISTED:
                out.append(f'<p class="muted">first {MAX_LISTED} listed; report.json has all.</p>')
    return "".join(out)


def _rows_table(rows: list[dict[str, Any]]) -> str:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    head = "".join(f"<th>{escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(_cell(r.get(k)) for k in keys) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(pid: str, images: dict[str, tuple[str, str]]) -> str:
    if pid not in images:
        return ""
    caption, b64 = images[pid]
    return (
        f'<figure><img class="plot" id="plot-{escape(pid)}" alt="{escape(caption)}" '
        f'src="data:image/png;base64,{b64}"><figcaption>{escape(caption)}</figcaption></figure>'
    )


def _rehearsal_banner(r: dict[str, Any]) -> str:
    """What a `--rehearse` run is, what it ran on, and the full plan's projected cost."""
    model = r.get("model") or {}
    cost = r.get("cost_projection") or {}
    lines = cost.get("lines") if cost.get("available") else [f"not available: {cost.get('reason')}"]
    items = "".join(
        f"<li>{escape(k)}: {escape(cell(v))}</li>"
        for k, v in (
            ("model", model.get("architecture")),
            ("layers", f"{model.get('num_hidden_layers')} {model.get('layer_types')}"),
            ("hidden size / parameters", f"{model.get('hidden_size')} / {model.get('params')}"),
            ("weights", model.get("weights")),
            ("tokenizer", model.get("tokenizer")),
            ("scale", r.get("scale")),
            ("the real plan", r.get("full_schedule")),
        )
    )
    return (
        '<div class="banner stop" id="rehearsal"><b>REHEARSAL.</b> '
        f"{escape(str(r.get('note')))}. Every phase ran at toy scale; the verdict below is "
        f"not evidence.<ul>{items}</ul><b>Cost projection of the real plan</b>"
        f"<pre>{escape(chr(10).join(map(str, lines or [])))}</pre></div>"
    )


def render_html(facts: dict[str, Any], images: dict[str, tuple[str, str]]) -> str:
    """The report page. `images` maps plot id -> (caption, base64 PNG)."""
    s: list[str] = []
    title = facts.get("title") or "losslab run"
    if facts.get("rehearsal"):
        title = f"REHEARSAL (not evidence): {title}"
    s.append(f"<h1>{escape(title)}</h1>")
    if facts.get("rehearsal"):
        s.append(_rehearsal_banner(facts["rehearsal"]))
    s.append(_status_banner(facts["status"]))
    s.append(_rederived_banner(facts.get("preflight_summary")))

    s.append('<section id="verdict"><h2>Verdict</h2>')
    s.append(_verdict(facts.get("verdict")))
    if facts.get("success_criterion"):
        s.append(
            f'<p class="muted">Pre-registered success criterion: '
            f"{escape(facts['success_criterion'])}</p>"
        )
    s.append("</section>")

    s.append('<section id="hypothesis"><h2>Hypothesis</h2>')
    s.append(f"<p>{escape(facts.get('hypothesis') or '—')}</p></section>")

    s.append('<section id="arms"><h2>Arms and the one switch</h2>')
    s.append(_rows_table(facts["arms"]) if facts["arms"] else "<p>—</p>")
    switch = facts.get("switch") or {}
    if switch:
        items = "".join(
            f"<li><code>{escape(k)}</code>: "
            + ", ".join(
                f"{escape(str(a))} = <code>{escape(cell(v))}</code>" for a, v in vals.items()
            )
            + "</li>"
            for k, vals in switch.items()
        )
        s.append(f"<p>The arms differ only in:</p><ul>{items}</ul>")
    s.append("</section>")

    s.append('<section id="preflight"><h2>Correctness preflight (errors vs tolerances)</h2>')
    s.append(
        _loss_code(facts.get("loss_code"))
        + _preflight(facts.get("preflight"), facts.get("preflight_summary"))
        + "</section>"
    )
    s.append('<section id="restoration"><h2>Restoration preflight</h2>')
    s.append(_checks_table(facts.get("restoration"), "The restoration preflight") + "</section>")

    s.append('<section id="gate"><h2>Activation gate (pilot: measured vs bounds)</h2>')
    s.append(f'<p class="muted">{escape(facts["pilot"]["note"])}</p>')
    s.append(_checks_table(facts.get("gate"), "The activation gate") + "</section>")
    s.append('<section id="pilot-diagnostics"><h2>Pilot diagnostics: mismatch vs drift</h2>')
    s.append(pilot_section(facts.get("pilot_diagnostics")) + "</section>")

    s.append('<section id="executed-config"><h2>Executed configuration vs plan</h2>')
    ex = facts.get("executed_config")
    if ex:
        rows = [
            {
                "arm": arm,
                "key": k,
                "plan": v.get("plan"),
                "executed": v.get("executed"),
                "match": v.get("match"),
            }
            for arm, vals in ex.items()
            for k, v in vals.items()
        ]
        s.append(_rows_table(rows))
    else:
        s.append('<p class="muted">not recorded (no trainer was created)</p>')
    s.append("</section>")

    feas = facts["feasibility"]
    s.append('<section id="feasibility"><h2>Feasibility: projected vs measured vs budget</h2>')
    s.append(_checks_table(feas.get("artifact"), "The feasibility projection"))
    art = feas.get("artifact") or {}
    if isinstance(art.get("phases"), dict) and art["phases"]:
        s.append("<h3>Projection by phase (seconds)</h3>")
        s.append(
            _rows_table(
                [{"phase": k, **v} for k, v in art["phases"].items() if isinstance(v, dict)]
            )
        )
    if art.get("note"):
        s.append(f'<p class="muted">{escape(str(art["note"]))}</p>')
    cost = art.get("cost_projection") or {}
    if cost.get("available"):
        s.append("<h3>Cost projection from the plan alone (before the pilot)</h3>")
        s.append(f"<pre id='cost-projection'>{escape(chr(10).join(cost.get('lines') or []))}</pre>")
        s.append(_kv_table(cost.get("vs_pilot")))
    s.append(
        _kv_table(
            {
                "measured wall seconds (all phases so far)": feas["measured_wall_seconds"],
                **{f"budget {k}": v for k, v in (feas.get("budget") or {}).items()},
            }
        )
    )
    s.append(_img("feasibility", images) + "</section>")

    s.append('<section id="training"><h2>Training curves per arm</h2><div class="plots">')
    curve_ids = [pid for pid in images if pid.startswith("curve-")]
    s.append("".join(_img(pid, images) for pid in curve_ids) or "<p>no training steps yet</p>")
    s.append("</div></section>")

    s.append('<section id="evaluation"><h2>Evaluation</h2>')
    if facts.get("evaluation") or facts.get("base_evaluation"):
        s.append(_evaluation_table(facts))
    else:
        s.append('<p class="muted">not reached</p>')
    s.append(_img("eval-accuracy", images))
    p = facts.get("paired")
    if p:
        t, b = escape(str(p["treatment"])), escape(str(p["baseline"]))
        s.append(
            '<h3>Paired table</h3><table id="paired-table">'
            f"<tr><th></th><th>{b} right</th><th>{b} wrong</th></tr>"
            f"<tr><th>{t} right</th><td>{p['both_right']}</td><td>b = {p['b']}</td></tr>"
            f"<tr><th>{t} wrong</th><td>c = {p['c']}</td><td>{p['both_wrong']}</td></tr>"
            f"</table><p class='muted'>n = {p['n']} paired items; b and c are the discordant "
            "pairs the decision rule rests on.</p>"
        )
    s.append("</section>")

    s.append('<section id="efficiency"><h2>Efficiency: accuracy vs training tokens</h2>')
    s.append(_efficiency(facts.get("efficiency"), images) + "</section>")

    s.append('<section id="flipped"><h2>Flipped items (the discordant pairs)</h2>')
    s.append(_flipped(facts.get("flipped")) + "</section>")

    s.append('<section id="power"><h2>Power of the decision rule</h2>')
    s.append(_power(facts.get("power")) + "</section>")

    s.append('<section id="grader-audit"><h2>Second grader (math-verify) vs the grades</h2>')
    s.append(_grader_audit(facts.get("grader_audit")) + "</section>")

    s.append(
        '<section id="generation-audit"><h2>Generation audit (overlap, one score per item)</h2>'
    )
    s.append(_generation_audit(facts.get("generation_audit")) + "</section>")

    s.append('<section id="not-done"><h2>What was not done</h2>')
    s.append(_not_done(facts.get("not_done")) + "</section>")

    s.append('<section id="environment"><h2>Environment</h2>')
    s.append(_kv_table(facts.get("environment")) + "</section>")

    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(s)
        + f"<script>{_SCRIPT}</script></body></html>\n"
    )

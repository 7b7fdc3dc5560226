"""`losslab crosscheck`: one fixture through every registered implementation of one loss family
(default "dppo": every DPPO implementation) and losslab.

Each implementation is a revision of a registered framework (`frameworks/`) whose configuration
is a loss of that family (`ResolvedReference.loss_family`; an adapter of another family is never
counted, and a revision of another family is refused), executed from its
pinned source (a `--source` checkout, else fetched into the cache; Spindle, which has no
fetchable commit, is re-derived and labelled so), plus, for each, the `losslab.losses`
configuration that its adapter says reproduces it. The result is a pairwise matrix over all of
them: gradient agreement (max |Δg| / max(1, |g|) within `grad_tol`), the number of loss tokens
whose gradients differ (|Δg| > 1e-6·max(1, |g|), the team notes' rule), the cosine of the two
gradients, and value agreement, which is only defined between two implementations with the
same value convention (values of the "logprob" and the ratio form never match).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.conformance.fixtures import Fixture, generate_fixture, stress_spec
from losslab.conformance.frameworks import LOSS_FAMILIES, registry, resolve_reference
from losslab.conformance.ours import config_losses, run_ours
from losslab.conformance.provenance import provenance_of
from losslab.plan import parse_revision

TOKEN_RTOL = 1e-6  # a token "differs" if |Δg| > 1e-6 * max(1, |g_ref|) (team notes §2.2)


def default_revisions(family: str = "dppo") -> list[tuple[str, str]]:
    """(name, revision) of every registered framework's example revisions whose configuration is
    a `family` loss, in registry order (each framework's `example_revisions` show its
    conventions: verl with and without bypass and with its ActorConfig cap, Stable-RL's
    *_recompute, SkyRL without rollout log-probs, prime-rl without its KL term)."""
    _check_family(family)
    out = []
    for fw in registry().values():
        if family in fw.families:
            for name, text in fw.example_revisions.items():
                if resolve_reference(parse_revision(text)).loss_family == family:
                    out.append((name, text))
    return out


def _check_family(family: str) -> None:
    if family not in LOSS_FAMILIES:
        raise ValueError(f"loss family {family!r}; expected one of {sorted(LOSS_FAMILIES)}")


def _entry(name: str, kind: str, result: Any, convention: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "label": label,
        "value_convention": convention,
        "loss": result["loss"],
        "grad_D": result["grad_D"],
    }


def run_implementations(
    revisions: Sequence[tuple[str, str]],
    fixture: Fixture,
    sources: Mapping[str, Path],
    *,
    fetch: bool = True,
    allow_rederivation: bool = False,
    offline: bool = False,
    family: str = "dppo",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run each revision (pinned) and its losslab configuration; (entries, implementation info).
    ValueError naming the revision when its configuration is not a `family` loss."""
    from losslab.conformance.preflight import _obtain

    _check_family(family)
    refs = [(name, text, resolve_reference(parse_revision(text))) for name, text in revisions]
    for name, text, ref in refs:
        if ref.loss_family != family:
            raise ValueError(
                f"--revision {name}={text}: a {ref.loss_family!r} loss ({ref.framework.name} "
                f"{ref.loss_name}); this crosscheck compares {family!r} implementations"
            )
    entries, info = [], []
    for name, text, ref in refs:
        res = _obtain(
            ref,
            fixture,
            sources,
            strict_sources=True,
            fetch=fetch,
            allow_rederivation=allow_rederivation,
            offline=offline,
        )
        ref = res.resolved or ref
        prov = provenance_of(res.source)
        entries.append(
            _entry(
                name,
                "pinned" if prov["executed"] else "rederivation",
                {"loss": res.loss, "grad_D": res.grad_D},
                ref.value_convention,
                prov["summary"],
            )
        )
        config = ref.framework.losslab_config(ref, fixture)
        record = {
            "name": name,
            "revision": text,
            "framework": ref.framework.name,
            "provenance": prov,
            "effective_params": ref.params,
            "notes": list(ref.notes),
            "losslab_config": config.spec,
            "losslab_reason": config.reason,
        }
        if config.loss is not None:
            trained, valued = config_losses(config)
            value, _, _ = run_ours(valued, fixture)
            _, grads, _ = run_ours(trained, fixture)
            conv = "logprob" if valued.params.get("surrogate") == "logprob" else "surrogate"
            entries.append(
                _entry(
                    f"losslab[{name}]",
                    "losslab",
                    {"loss": value, "grad_D": grads},
                    conv,
                    f"losslab.losses {valued.spec}",
                )
            )
        info.append(record)
    return entries, info


def compare_pair(a: Mapping[str, Any], b: Mapping[str, Any], fixture: Fixture) -> dict[str, Any]:
    """One matrix cell: b measured against a (a is the reference of the pair)."""
    live = np.concatenate([s.loss_mask != 0 for s in fixture.sequences])
    ga = np.concatenate([np.asarray(g, np.float64) for g in a["grad_D"]])
    gb = np.concatenate([np.asarray(g, np.float64) for g in b["grad_D"]])
    finite = np.isfinite(ga) & np.isfinite(gb)
    diff = np.where(finite, np.abs(ga - gb), np.inf)
    scaled = diff / np.maximum(1.0, np.abs(np.where(np.isfinite(ga), ga, 0.0)))
    differing = int((live & (scaled > TOKEN_RTOL)).sum())
    na, nb = np.linalg.norm(ga[finite]), np.linalg.norm(gb[finite])
    cosine = float(ga[finite] @ gb[finite] / (na * nb)) if na > 0 and nb > 0 else float("nan")
    same_conv = a["value_convention"] == b["value_convention"]
    scale = max(1.0, abs(a["loss"]))
    value_rel = abs(a["loss"] - b["loss"]) / scale if same_conv else None
    return {
        "tokens_differing": differing,
        "max_scaled_grad_error": float(np.max(scaled[live])) if live.any() else 0.0,
        "cosine": cosine,
        "value_relative_error": value_rel,
        "value_comparable": same_conv,
    }


def crosscheck(
    revisions: Sequence[tuple[str, str]] | None = None,
    fixture: Fixture | None = None,
    sources: Mapping[str, Path] | None = None,
    *,
    fetch: bool = True,
    allow_rederivation: bool = False,
    offline: bool = False,
    grad_tol: float = 1e-5,
    value_tol: float = 1e-5,
    family: str = "dppo",
) -> dict[str, Any]:
    """The pairwise matrix (see module docstring) as a JSON-ready dict; `revisions` default to
    `default_revisions(family)`."""
    fixture = fixture or generate_fixture(stress_spec())
    entries, info = run_implementations(
        revisions or default_revisions(family),
        fixture,
        sources or {},
        fetch=fetch,
        allow_rederivation=allow_rederivation,
        offline=offline,
        family=family,
    )
    names = [e["name"] for e in entries]
    matrix: dict[str, dict[str, Any]] = {}
    for a in entries:
        row = {}
        for b in entries:
            cell = compare_pair(a, b, fixture)
            cell["gradient_agrees"] = cell["max_scaled_grad_error"] <= grad_tol
            cell["value_agrees"] = (
                None
                if cell["value_relative_error"] is None
                else cell["value_relative_error"] <= value_tol
            )
            row[b["name"]] = cell
        matrix[a["name"]] = row
    return {
        "family": family,
        "fixture": {
            "sha256": fixture.sha256(),
            "description": fixture.description(),
            "loss_tokens": int(sum((s.loss_mask != 0).sum() for s in fixture.sequences)),
        },
        "torch": torch.__version__,
        "token_rule": f"|dg| > {TOKEN_RTOL:g} * max(1, |g_row|) on a loss token",
        "grad_tol": grad_tol,
        "value_tol": value_tol,
        "implementations": info,
        "entries": [{k: v for k, v in e.items() if k != "grad_D"} for e in entries],
        "names": names,
        "matrix": matrix,
    }


def _cell_text(cell: Mapping[str, Any]) -> str:
    cos = cell["cosine"]
    cos_text = "nan" if cos != cos else f"{cos:.3f}"
    return f"{cell['tokens_differing']} / {cos_text}"


def html_section(result: Mapping[str, Any]) -> str:
    """The matrix as an HTML <section> (cells: tokens differing / gradient cosine; green when the
    gradients agree), to embed in a report page."""
    names = result["names"]
    esc = html.escape
    rows = []
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    for a in names:
        cells = []
        for b in names:
            cell = result["matrix"][a][b]
            color = "#d4f4d4" if cell["gradient_agrees"] else "#f8d7d7"
            title = f"max scaled grad err {cell['max_scaled_grad_error']:.3g}; value " + (
                "n/a (different value conventions)"
                if cell["value_relative_error"] is None
                else f"rel err {cell['value_relative_error']:.3g}"
            )
            cells.append(
                f'<td style="background:{color}" title="{esc(title)}">{esc(_cell_text(cell))}</td>'
            )
        rows.append(f"<tr><th>{esc(a)}</th>{''.join(cells)}</tr>")
    impl_rows = "".join(
        f"<tr><td>{esc(i['name'])}</td><td>{esc(i['provenance']['summary'])}</td>"
        f"<td><code>{esc(i['losslab_config'])}</code></td></tr>"
        for i in result["implementations"]
    )
    return (
        f'<section id="crosscheck"><h2>Cross-framework crosscheck: {esc(result["family"])}</h2>'
        f"<p>Fixture: {esc(result['fixture']['description'])} (sha256 "
        f"{esc(result['fixture']['sha256'][:16])}…). Cell = loss tokens whose gradient differs "
        f"({esc(result['token_rule'])}) / cosine of the gradients; green = gradients agree "
        f"(max scaled error ≤ {result['grad_tol']:g}). Values are compared only within one value "
        "convention (hover a cell).</p>"
        f"<table border=1 cellspacing=0 cellpadding=3><tr><th></th>{head}</tr>{''.join(rows)}</table>"
        "<h3>Implementations</h3><table border=1 cellspacing=0 cellpadding=3>"
        "<tr><th>name</th><th>provenance</th><th>matching losslab configuration</th></tr>"
        f"{impl_rows}</table></section>"
    )


def write_html(result: Mapping[str, Any], out: str | Path) -> Path:
    """A standalone page holding `html_section` (written atomically)."""
    from losslab.atomic import atomic_write_text

    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>losslab crosscheck</title>"
        "</head><body>" + html_section(result) + "</body></html>"
    )
    return atomic_write_text(out, page)

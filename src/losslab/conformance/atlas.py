"""`losslab atlas`: every registered loss x implementation against losslab, on set A and the
atlas stress fixture, with every disagreement named.

A row is one implementation of one loss family (`frameworks.LOSS_FAMILIES`): a framework's
example revision of that family (`Framework.example_revisions`), executed from its pinned
source (a `--source` checkout or the fetched cache), or, for a framework with no public source
(Tinker), its documented formula, labelled so. Each row holds, per fixture: the reference's
value and gradient, the matching `losslab.losses` configuration's (`Framework.losslab_config`),
whether value and gradient agree, the loss tokens whose gradient differs (|Δg| >
1e-6·max(1, |g_ref|), `crosscheck.TOKEN_RTOL`; two equal non-finite entries agree), the first
of them with their log-ratio, and the gradient cosine over the finite entries. Where they
differ the row says why in one line: the adapter's reason (a convention losslab has no knob
for, or no losslab loss of the family), else the classifier's named convention
(`classify.classify`: the single knob change that makes both checks pass).

The result is JSON (`run_atlas`), rendered as docs/atlas.md (`render_markdown`). Committed as a
golden file it holds the reference numbers (numbers only, never source), so
`check_atlas_golden` re-runs every losslab configuration offline and names each row whose
numbers changed (tests/conformance/test_atlas.py, in `make test`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.conformance.classify import classify
from losslab.conformance.crosscheck import TOKEN_RTOL
from losslab.conformance.fixtures import (
    Fixture,
    FixtureSpec,
    atlas_stress_spec,
    generate_fixture,
)
from losslab.conformance.frameworks import (
    LOSS_FAMILIES,
    LosslabConfig,
    registry,
    resolve_reference,
)
from losslab.conformance.metrics import Tolerance
from losslab.conformance.ours import config_losses, run_ours
from losslab.conformance.provenance import provenance_of
from losslab.plan import parse_revision

FORMAT = "losslab-atlas/1"
VALUE_RTOL = 1e-5  # value agrees if |Δ| <= 1e-5 * max(1, |value_ref|)
SHOWN_TOKENS = 4  # differing tokens listed per row and fixture
CLASSIFY_TOLERANCES = {
    "loss": Tolerance(atol=1e-5, rtol=1e-5),
    "gradient": Tolerance(atol=1e-6, rtol=1e-5),
}


def atlas_fixtures() -> dict[str, FixtureSpec]:
    """The two fixtures of every row: set A and the atlas stress fixture."""
    return {"set_a": FixtureSpec(), "stress": atlas_stress_spec()}


def atlas_revisions() -> list[tuple[str, str, str]]:
    """(family, implementation name, revision) for every registered framework's example
    revisions, grouped by family in `LOSS_FAMILIES` order, registry order within a family."""
    found: dict[str, list[tuple[str, str]]] = {family: [] for family in LOSS_FAMILIES}
    for fw in registry().values():
        for name, text in fw.example_revisions.items():
            family = resolve_reference(parse_revision(text)).loss_family
            found[family].append((name, text))
    return [(family, name, text) for family, rows in found.items() for name, text in rows]


def _finite_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Entries where both sides hold the same non-finite value (inf, -inf or nan)."""
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    return both_nan | same_inf


def compare_gradients(
    ref_D: Sequence[Any], ours_D: Sequence[Any], fixture: Fixture
) -> dict[str, Any]:
    """Loss tokens whose gradients differ (equal non-finite entries agree), the first
    `SHOWN_TOKENS` of them as (datum, position, log r), and the cosine over finite entries."""
    live = np.concatenate([s.loss_mask != 0 for s in fixture.sequences])
    where = [(d, t) for d, s in enumerate(fixture.sequences) for t in range(len(s.loss_mask))]
    log_r = np.concatenate(
        [
            s.current_logprobs.astype(np.float64) - s.sampler_logprobs.astype(np.float64)
            for s in fixture.sequences
        ]
    )
    ga = np.concatenate([np.asarray(g, np.float64) for g in ref_D])
    gb = np.concatenate([np.asarray(g, np.float64) for g in ours_D])
    finite = np.isfinite(ga) & np.isfinite(gb)
    diff = np.abs(np.where(finite, ga, 0.0) - np.where(finite, gb, 0.0))
    scaled = np.where(finite, diff, np.inf) / np.maximum(1.0, np.abs(np.where(finite, ga, 0.0)))
    differs = live & (scaled > TOKEN_RTOL) & ~_finite_equal(ga, gb)
    idx = np.flatnonzero(differs)
    na, nb = np.linalg.norm(ga[finite]), np.linalg.norm(gb[finite])
    cosine = float(ga[finite] @ gb[finite] / (na * nb)) if na > 0 and nb > 0 else float("nan")
    return {
        "tokens_differing": int(idx.size),
        "first_differing": [
            {"datum": where[i][0], "pos": where[i][1], "log_ratio": round(float(log_r[i]), 4)}
            for i in idx[:SHOWN_TOKENS]
        ],
        "cosine": cosine,
        "non_finite_reference": int((live & ~np.isfinite(ga)).sum()),
    }


def values_agree(ref: float, ours: float) -> bool:
    if math.isnan(ref) or math.isnan(ours):
        return math.isnan(ref) and math.isnan(ours)
    if math.isinf(ref) or math.isinf(ours):
        return ref == ours
    return abs(ref - ours) <= VALUE_RTOL * max(1.0, abs(ref))


def losslab_side(config: LosslabConfig, fixture: Fixture) -> dict[str, Any]:
    """losslab's value (in the reference's convention), gradient (as trained) and blocked-token
    count on `fixture` for `config`."""
    trained, valued = config_losses(config)
    value, _, _ = run_ours(valued, fixture)
    _, grads, kept = run_ours(trained, fixture)
    live = [s.loss_mask != 0 for s in fixture.sequences]
    blocked = int(sum(((~k) & m).sum() for k, m in zip(kept, live, strict=True)))
    return {"loss": value, "grad_D": grads, "blocked": blocked}


def row_cell(
    reference: Mapping[str, Any], ours: Mapping[str, Any], fixture: Fixture
) -> dict[str, Any]:
    """One row's numbers on one fixture."""
    cmp = compare_gradients(reference["grad_D"], ours["grad_D"], fixture)
    return {
        "reference_loss": float(reference["loss"]),
        "losslab_loss": float(ours["loss"]),
        "value_agrees": values_agree(float(reference["loss"]), float(ours["loss"])),
        "gradient_agrees": cmp["tokens_differing"] == 0,
        "losslab_blocked_tokens": ours["blocked"],
        **cmp,
    }


def _encode(values: Any) -> str:
    """A float32 vector as one line of text: 9 significant digits round-trip a float32, and
    `inf`/`-inf`/`nan` are written as such (the golden file stays diffable)."""
    return " ".join(f"{x:.9g}" for x in np.asarray(values, np.float64).reshape(-1).tolist())


def decode(text: str) -> np.ndarray:
    """The inverse of `_encode`."""
    return np.asarray([float(x) for x in text.split()], np.float32)


def _reason(config: LosslabConfig, cells: Mapping[str, Mapping[str, Any]], named: str) -> str:
    agree = all(c["value_agrees"] and c["gradient_agrees"] for c in cells.values())
    if config.loss is None:
        return config.reason
    if agree:
        return ""
    return (
        config.reason
        or named
        or "differs; no single convention change of the classifier makes it pass"
    )


def run_row(
    family: str,
    name: str,
    text: str,
    fixtures: Mapping[str, Fixture],
    sources: Mapping[str, Path],
    *,
    fetch: bool = True,
    offline: bool = False,
) -> dict[str, Any]:
    """One atlas row: the reference on each fixture, losslab's configuration, the comparison."""
    from losslab.conformance.preflight import _obtain

    ref = resolve_reference(parse_revision(text))
    fw = ref.framework
    refs, cells, named, params_by_fixture = {}, {}, "", {}
    config: LosslabConfig | None = None
    prov: dict[str, Any] = {}
    for fx_name, fx in fixtures.items():
        res = _obtain(ref, fx, sources, strict_sources=True, fetch=fetch, offline=offline)
        ref = res.resolved or ref
        prov = provenance_of(res.source)
        refs[fx_name] = {"loss": float(res.loss), "grad_D": [_encode(g) for g in res.grad_D]}
        config = fw.losslab_config(ref, fx)
        if config.loss is not None:
            params_by_fixture[fx_name] = config.params  # a count may depend on the fixture
            ours = losslab_side(config, fx)
            cells[fx_name] = row_cell({"loss": res.loss, "grad_D": res.grad_D}, ours, fx)
            if not (cells[fx_name]["value_agrees"] and cells[fx_name]["gradient_agrees"]):
                if not named and not config.reason:
                    trained, valued = config_losses(config)
                    found = classify(trained, valued, res, fx, CLASSIFY_TOLERANCES)
                    named = "; ".join(m["summary"] for m in found["matches"])
    assert config is not None  # at least one fixture
    documented = not fw.fetchable and fw.rederivation is not None and fw.name == "tinker"
    return {
        "family": family,
        "name": name,
        "framework": fw.name,
        "revision": text,
        "function": ref.revision.function,
        "provenance": "documented formula, no source" if documented else prov["summary"],
        "executed": bool(prov.get("executed")),
        "normaliser": fw.aggregation_of(ref),
        "effective_params": ref.params,
        "notes": list(ref.notes),
        "losslab": None
        if config.loss is None
        else {
            "loss": config.loss,
            "params": config.params,
            "value_params": config.value_params,
            "params_by_fixture": params_by_fixture,
            "spec": config.spec,
        },
        "reason": _reason(config, cells, named),
        "classifier": named,
        "cells": cells,
        "reference": refs,
    }


def run_atlas(
    sources: Mapping[str, Path] | None = None,
    *,
    fetch: bool = True,
    offline: bool = False,
    progress: Callable[[str], None] | None = None,
    families: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Every row of the atlas (see module docstring) as a JSON-ready dict; `progress` gets one
    line before each row is fetched/run."""
    say = progress or (lambda line: None)
    specs = atlas_fixtures()
    fixtures = {k: generate_fixture(v) for k, v in specs.items()}
    plan = [r for r in atlas_revisions() if families is None or r[0] in families]
    if families is not None:
        unknown = sorted(set(families) - set(LOSS_FAMILIES))
        if unknown:
            raise ValueError(
                f"--family {unknown}; expected loss families from {sorted(LOSS_FAMILIES)}"
            )
    rows = []
    for i, (family, name, text) in enumerate(plan, 1):
        rev = parse_revision(text)
        where = "--source" if rev.repo in (sources or {}) else "cache/fetch"
        say(f"[{i}/{len(plan)}] {family}: {name} <- {rev.repo}@{rev.commit[:8]} ({where})")
        rows.append(
            run_row(family, name, text, fixtures, sources or {}, fetch=fetch, offline=offline)
        )
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "token_rule": f"|dg| > {TOKEN_RTOL:g} * max(1, |g_ref|) on a loss token; equal "
        "non-finite entries agree",
        "value_rule": f"|dv| <= {VALUE_RTOL:g} * max(1, |v_ref|)",
        "fixtures": {
            k: {"generator": specs[k].to_generator_block(), "sha256": fx.sha256()}
            for k, fx in fixtures.items()
        },
        "families": {f: LOSS_FAMILIES[f] for f in dict.fromkeys(r["family"] for r in rows)},
        "rows": rows,
        "summary": summary(rows),
    }


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts over the rows: families, frameworks, rows equal on both fixtures, rows with a
    reason, and rows that differ with no reason (must be none)."""
    equal = [
        r["name"]
        for r in rows
        if r["cells"]
        and all(c["value_agrees"] and c["gradient_agrees"] for c in r["cells"].values())
    ]
    return {
        "rows": len(rows),
        "families": sorted({r["family"] for r in rows}),
        "frameworks": sorted({r["framework"] for r in rows}),
        "executed_rows": sum(1 for r in rows if r["executed"]),
        "equal_rows": equal,
        "reasoned_rows": [r["name"] for r in rows if r["reason"]],
        "unexplained_rows": [r["name"] for r in rows if r["name"] not in equal and not r["reason"]],
    }


# ------------------------------------------------------------------- the golden check ---


def recheck_row(row: Mapping[str, Any], fixtures: Mapping[str, Fixture]) -> dict[str, Any]:
    """A row's cells recomputed offline: losslab's configuration run again and compared with the
    reference numbers the row holds."""
    lab = row["losslab"]
    cells = {}
    for fx_name, fx in fixtures.items():
        params = lab.get("params_by_fixture", {}).get(fx_name, lab["params"])
        config = LosslabConfig(lab["loss"], dict(params), dict(lab["value_params"]))
        stored = row["reference"][fx_name]
        reference = {"loss": stored["loss"], "grad_D": [decode(g) for g in stored["grad_D"]]}
        cells[fx_name] = row_cell(reference, losslab_side(config, fx), fx)
    return cells


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= 1e-6 * max(1.0, abs(a))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def check_atlas_golden(data: Mapping[str, Any]) -> list[str]:
    """Re-run every row's losslab configuration on the golden's fixtures; one line per cell
    field that no longer matches (empty: every row holds)."""
    if data.get("format") != FORMAT:
        raise ValueError(f"atlas golden format = {data.get('format')!r}; expected {FORMAT!r}")
    fixtures = {}
    for k, block in data["fixtures"].items():
        fx = generate_fixture(FixtureSpec.from_generator_block(block["generator"]))
        if fx.sha256() != block["sha256"]:
            return [f"fixture {k}: sha256 {fx.sha256()[:12]} != golden {block['sha256'][:12]}"]
        fixtures[k] = fx
    problems = []
    for row in data["rows"]:
        if row["losslab"] is None:
            continue
        got = recheck_row(row, fixtures)
        for fx_name, cell in row["cells"].items():
            for key, want in cell.items():
                have = got[fx_name][key]
                if not _same(json_float(want), json_float(have)):
                    problems.append(
                        f"{row['name']} [{fx_name}] {key}: golden {want!r}, now {have!r}"
                    )
    return problems


def json_float(x: Any) -> Any:
    """ints stay ints; floats (and their JSON text forms) become floats, for `_same`."""
    if isinstance(x, float):
        return x
    if isinstance(x, list):
        return [json_float(v) for v in x]
    if isinstance(x, Mapping):
        return {k: json_float(v) for k, v in x.items()}
    return x


# ------------------------------------------------------------------------ docs/atlas.md ---


def _cell_text(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "–"
    cos = cell["cosine"]
    cos_text = "nan" if cos != cos else f"{cos:.4f}"
    value = "=" if cell["value_agrees"] else "≠"
    return f"value {value}, {cell['tokens_differing']} tok, cos {cos_text}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _source_text(row: Mapping[str, Any]) -> str:
    """The row's provenance in a few words (the JSON keeps the full line)."""
    repo_commit = row["revision"].split(":", 1)[0]
    repo, commit = repo_commit.split("@")
    if row["executed"] and f"{repo}@{commit}" not in row["provenance"]:
        # an installed release pinned by its file (TRL): the provenance names the version
        return row["provenance"].split(" (file sha256", 1)[0]
    if row["executed"]:
        return f"executed pinned source {repo}@{commit[:8]}"
    if row["provenance"].startswith("documented formula"):
        return row["provenance"]
    return f"losslab re-derivation of {repo}@{commit[:8]} (no fetchable commit)"


def _category(reason: str) -> str:
    head = reason.split(":", 1)[0]
    if reason.startswith("losslab's registry has no"):
        return "no losslab loss"
    return head if len(head) < 24 else "other"


def render_markdown(result: Mapping[str, Any]) -> str:
    """The atlas as docs/atlas.md: one table per loss family (the file is generated: edit the
    adapters or the fixtures, then rerun `losslab atlas --markdown docs/atlas.md`)."""
    s = result["summary"]
    lines = [
        "# The loss atlas",
        "",
        "<!-- generated by `losslab atlas --markdown docs/atlas.md` from the committed golden "
        "tests/conformance/data/atlas_golden.json; tests/conformance/test_atlas.py checks that "
        "this file is that rendering. Do not edit by hand. -->",
        "",
        f"{len(s['families'])} loss families, {s['rows']} implementations in "
        f"{len(s['frameworks'])} framework adapters ({', '.join(s['frameworks'])}); "
        f"{s['executed_rows']} rows executed from pinned source, the others from a documented "
        "formula (Tinker) or losslab's labelled re-derivation (Spindle, no fetchable commit). "
        f"{len(s['equal_rows'])} rows equal losslab's configuration on both fixtures, "
        f"{len(s['reasoned_rows'])} carry a named reason, {len(s['unexplained_rows'])} "
        "differ unexplained.",
        "",
        "Each row runs the reference and the `losslab.losses` configuration its adapter names "
        "(`Framework.losslab_config`) on set A and on the atlas stress fixture "
        "(`fixtures.atlas_stress_spec()`: the stress fixture plus log r = +91 > 88.7 at "
        "position 24 of sequences 0 and 1, advantages x2.5). A cell reads: value equal (=) "
        f"or not (≠, rule {result['value_rule']}); loss tokens whose gradient differs "
        f"({result['token_rule']}); cosine of the two gradients over their finite entries. "
        "The reason column says why a pair differs: the adapter's named convention, or the "
        "classifier's (the single knob change under which both checks pass).",
        "",
        "Fixtures: "
        + "; ".join(f"`{k}` sha256 {v['sha256'][:16]}…" for k, v in result["fixtures"].items())
        + f". torch {result['torch']}.",
        "",
    ]
    counts: dict[str, list[str]] = {}
    for r in result["rows"]:
        if r["reason"]:
            counts.setdefault(_category(r["reason"]), []).append(r["name"])
    lines += ["Named reasons by kind:", ""]
    lines += [f"* {kind} ({len(names)}): {', '.join(names)}" for kind, names in counts.items()]
    lines.append("")
    for family, meaning in result["families"].items():
        lines += [
            f"## {family}",
            "",
            _md(meaning),
            "",
            "| implementation | source | normaliser | losslab configuration | set A | stress "
            "| reason |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["rows"]:
            if r["family"] != family:
                continue
            lab = r["losslab"]
            config = f"`{_md(lab['spec'])}`" if lab else "none"
            reason = r["reason"] or "equal"
            lines.append(
                f"| {r['name']} (`{r['function']}`) | {_md(_source_text(r))} | "
                f"{_md(r['normaliser'])} | {config} | {_cell_text(r['cells'].get('set_a'))} | "
                f"{_cell_text(r['cells'].get('stress'))} | {_md(reason)} |"
            )
        lines.append("")
    return "\n".join(lines)

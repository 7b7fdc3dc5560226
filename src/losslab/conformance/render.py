"""Terminal tables (rich) for preflight and golden-file reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from losslab.conformance.golden import GoldenReport


def _console(console: Console | None) -> Console:
    """The given console, else stdout's; 140 columns when piped so the tables stay readable."""
    if console is not None:
        return console
    console = Console()
    return console if console.is_terminal else Console(width=140)


def _ok(passed: bool) -> str:
    return "[green]pass[/green]" if passed else "[bold red]FAIL[/bold red]"


def render_preflight(report: Mapping[str, Any], console: Console | None = None) -> None:
    """One table per path: each check's errors against its tolerance, then sources and fractions."""
    console = _console(console)
    for side, record in (report.get("provenance") or {}).items():  # first, and prominently
        console.print(
            f"{side}: {record['summary']}",
            style="bold" if record.get("executed") else "bold yellow",
            highlight=False,
            markup=False,
        )
    for path in report["paths"]:
        table = Table(title=f"correctness preflight: {path['id']}", box=box.SIMPLE_HEAD)
        table.add_column("check", no_wrap=True)
        table.add_column("result", no_wrap=True)
        for col in ("max|err|", "rel L2", "cosine", "atol/rtol/cos", "viol"):
            table.add_column(col, justify="right", no_wrap=True)
        for name, chk in path["checks"].items():
            err, tol = path["errors"][name], chk["tolerance"]
            tol_text = f"{tol['atol']:.0e}/{tol['rtol']:.0e}/{tol.get('min_cosine') or '-'}"
            table.add_row(
                name,
                _ok(chk["passed"]),
                f"{err['max_abs_error']:.2e}",
                f"{err['relative_l2_error']:.2e}",
                f"{err['cosine_similarity']:.6f}",
                tol_text,
                str(chk["violations"]),
            )
        stress = path.get("stress")
        if stress:
            for name, chk in stress["checks"].items():
                err, tol = stress["errors"][name], chk["tolerance"]
                table.add_row(
                    f"stress {name}",
                    _ok(chk["passed"]),
                    f"{err['max_abs_error']:.2e}",
                    f"{err['relative_l2_error']:.2e}",
                    f"{err['cosine_similarity']:.6f}",
                    f"{tol['atol']:.0e}/{tol['rtol']:.0e}/{tol.get('min_cosine') or '-'}",
                    str(chk["violations"]),
                )
        console.print(table)
        verdicts = dict(path.get("classification") or {})
        if stress and stress.get("classification"):
            verdicts["reference (stress fixture)"] = stress["classification"]
        for role, verdict in verdicts.items():
            console.print(
                f"  {role} disagreement: {verdict['summary']}",
                style="bold red",
                highlight=False,
                markup=False,
            )
        for role, src in path["reference_sources"].items():
            line = f"  {role}: {src['label']}"
            if src.get("file_sha256"):
                line += f" (file sha256 {src['file_sha256'][:16]}…)"
            console.print(line, highlight=False, markup=False)
            if src.get("fallback_reason"):
                console.print(
                    f"    fallback reason: {src['fallback_reason']}",
                    style="yellow",
                    highlight=False,
                    markup=False,
                )
            for note in src.get("notes", []):
                console.print(f"    note: {note}", highlight=False, markup=False)
        for role, fired in path["fired"].items():
            ours, ref = fired["ours"], fired["reference"]
            ref_all = "n/a" if ref["fraction"] is None else f"{ref['fraction']:.1%}"
            ours_all = "n/a" if ours["fraction"] is None else f"{ours['fraction']:.1%}"
            console.print(
                f"  fired {role}: ours {ours_all} of loss tokens "
                f"({ours['fraction_nonzero_adv']:.1%} of those with A != 0), reference "
                f"{ref_all} ({ref['fraction_nonzero_adv']:.1%})",
                highlight=False,
            )
        console.print(
            f"  fixed input sha256 {path['fixed_input']['sha256']}: "
            f"{path['fixed_input']['description']}",
            highlight=False,
            markup=False,
        )
    verdict = "passed" if report["passed"] else "FAILED"
    console.print(f"preflight {verdict}", style="green" if report["passed"] else "bold red")


def render_golden(report: GoldenReport, console: Console | None = None) -> None:
    """Per output: pass/fail, loss error, worst gradient error, differing clip/mask tokens."""
    console = _console(console)
    table = Table(title=f"golden check: {report.path}", box=box.SIMPLE_HEAD)
    table.add_column("output", no_wrap=True, min_width=28)
    table.add_column("result", no_wrap=True)
    table.add_column("reference", no_wrap=True)
    for col in ("loss err", "grad err", "clip/mask"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("differing (seq, t)", min_width=18)
    for o in report.outputs:
        if o.error:
            table.add_row(o.name, _ok(False), o.reference or "-", o.error, "", "", "")
            continue
        diff = ""
        if o.only_ours or o.only_golden:
            diff = f"only ours {o.only_ours[:5]}, only golden {o.only_golden[:5]}"
        counts = f"{o.count_ours}/{o.count_golden if o.count_golden is not None else '-'}"
        table.add_row(
            o.name,
            _ok(o.passed),
            o.reference,
            f"{o.loss_error:.2e}",
            f"{o.grad_error:.2e}",
            counts,
            diff or "none",
        )
    console.print(table)
    if report.generator_reproduces is not None:
        console.print(
            "  generator block regenerates the sequences bit for bit"
            if report.generator_reproduces
            else "  generator block does NOT regenerate the sequences",
            highlight=False,
        )
    console.print(
        f"  loss err = |ours - golden| / loss_term_abs_sum_float64 (tolerance "
        f"{report.loss_tolerance:g}); grad err = max |ours - golden| / max(1, |g|) "
        f"(tolerance {report.grad_tolerance:g}); clip/mask = tokens ours/golden",
        highlight=False,
    )
    console.print(
        "golden check passed" if report.passed else "golden check FAILED",
        style="green" if report.passed else "bold red",
    )


def render_crosscheck(result: Mapping[str, Any], console: Console | None = None) -> None:
    """The pairwise matrix: loss tokens whose gradient differs / gradient cosine per pair."""
    console = _console(console)
    for impl in result["implementations"]:
        console.print(
            f"{impl['name']}: {impl['provenance']['summary']}", highlight=False, markup=False
        )
        console.print(
            f"    losslab configuration: {impl['losslab_config']}", highlight=False, markup=False
        )
    names = result["names"]
    short = [n.replace("losslab[", "L[") for n in names]
    table = Table(
        title="crosscheck: loss tokens whose gradient differs (row = reference of the pair)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("implementation", no_wrap=True)
    for i in range(len(names)):
        table.add_column(str(i + 1), justify="right", no_wrap=True)
    for i, a in enumerate(names):
        cells = []
        for b in names:
            cell = result["matrix"][a][b]
            text = str(cell["tokens_differing"])
            cells.append(f"[green]{text}[/green]" if cell["gradient_agrees"] else text)
        table.add_row(str(i + 1), short[i], *cells)
    console.print(table)
    for a in names:
        if not a.startswith("losslab["):
            continue
        own = a[len("losslab[") : -1]
        cell = result["matrix"][own][a]
        console.print(
            f"  {a} vs {own}: {cell['tokens_differing']} tokens differ, cosine "
            f"{cell['cosine']:.6f}, max scaled grad err {cell['max_scaled_grad_error']:.2e}",
            highlight=False,
            markup=False,
        )
    console.print(
        f"  fixture: {result['fixture']['description']}",
        highlight=False,
        markup=False,
    )
    console.print(
        f"  green: gradients agree (max |dg|/max(1,|g|) <= {result['grad_tol']:g}); a token "
        f"differs when {result['token_rule']}; values compared only within one value convention",
        highlight=False,
    )

"""The `losslab` command line: one thin typer function per command.

Every command calls a function that a Python user can call too; the CLI holds no logic of its own.
Sub-command groups (`plan`, `golden`) are typer sub-apps registered below.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from losslab.backends import BACKENDS, DEFAULT_BACKEND  # the registry only: no backend loaded
from losslab.cli_errors import GuardedGroup


class _LosslabGroup(GuardedGroup, TyperGroup):
    """The root command group: every command runs under `cli_errors.guarded` (no tracebacks)."""


app = typer.Typer(
    name="losslab",
    cls=_LosslabGroup,
    help="Trustworthy post-training RL loss experiments from one plan file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """losslab: is my loss the paper's loss, are the arms comparable, does the loss act, who wins."""


@app.command()
def version() -> None:
    """Print the losslab version."""
    from losslab import __version__

    typer.echo(__version__)


# --- command registrations (each part of the product adds its commands in its own section) ---

# --- plan: check and show a plan file (losslab.plan) ---

plan_app = typer.Typer(
    help="Check a plan file or show what it will run.", no_args_is_help=True, add_completion=False
)
app.add_typer(plan_app, name="plan")


@plan_app.command("check")
def plan_check(
    plan_file: str = typer.Argument(..., help="The plan JSON file."),
) -> None:
    """Validate PLAN_FILE: every problem on its own `json.path: message` line; exit 0, 1 (the
    plan has problems) or 2 (PLAN_FILE is missing, not a regular file, too large or not UTF-8)."""
    from losslab.plan import check_plan_file

    result = check_plan_file(plan_file)
    if result.unreadable:
        typer.echo(f"error: {result.errors[0].message}", err=True)
        raise typer.Exit(2)
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if not result.ok:
        for problem in result.errors:
            typer.echo(f"error: {problem}", err=True)
        count = len(result.errors)
        typer.echo(f"{plan_file}: {count} problem{'s' if count != 1 else ''}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{plan_file}: ok ({len(result.warnings)} warnings)")


@plan_app.command("show")
def plan_show(
    plan_file: str = typer.Argument(..., help="The plan JSON file."),
    data: str | None = typer.Option(
        None, "--data", help="The task's data folder, to measure prompt lengths for the cost."
    ),
    gpu: str = typer.Option("H100-SXM", "--gpu", help="GPU class of the cost projection."),
    utilisation: float = typer.Option(
        0.25, "--utilisation", help="Assumed fraction of the GPU's peak the run reaches."
    ),
    prices: str | None = typer.Option(
        None,
        "--prices",
        help="JSON price table for the Tinker cost (default: the plan's engine.price_table, "
        "else losslab's dated table, losslab/stats/tinker_prices.json).",
    ),
) -> None:
    """Summarize PLAN_FILE: arms and their switch, preflights, gate, decision rule, budget,
    the projected GPU cost against the budget (losslab.stats.cost) and the Tinker token
    counts and dollars (losslab.stats.tinker_cost)."""
    from losslab.plan import check_plan_file, plan_summary
    from losslab.stats.cost import plan_cost, unmeasured_prompt_bound
    from losslab.stats.power import power_lines
    from losslab.stats.tinker_cost import load_price_table, plan_price_table, tinker_cost

    result = check_plan_file(plan_file)
    if result.plan is None:
        for problem in result.errors:
            typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2 if result.unreadable else 1)
    typer.echo(plan_summary(result.plan, decision_notes=power_lines(result.plan)))
    plan = result.plan
    try:
        table = load_price_table(prices or plan_price_table(plan.engine.price_table, plan_file))
    except ValueError as exc:
        option = "--prices" if prices else "engine.price_table"
        typer.echo(f"error: {option}: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        cost = plan_cost(plan, data=data, gpu=gpu, utilisation=utilisation)
    except ValueError as exc:  # unknown model size, bad --gpu / --utilisation
        typer.echo(f"\nCost projection: not available ({exc})")
        prompt = unmeasured_prompt_bound(plan)
    else:
        typer.echo("\n" + "\n".join(cost.lines()))
        prompt = cost.prompt
    typer.echo("\n" + "\n".join(tinker_cost(plan, prompt.mean_tokens, table).lines()))


# --- conform: module conformance (losslab.conformance.modules) ---

_CONFORM_HELP = (
    "Compare every function IMPL and REFERENCE share on held-out inputs; exit 1 on any failure."
    "\n\nIMPL and REFERENCE are module paths (losslab.objectives) or .py files; a file is executed. "
    "Inputs come from the input-spec registry of the 49 objectives: seeded random cases plus edge "
    "cases per function. Tolerances: primitives atol 1e-6 / rtol 1e-5, composites atol 1e-5 / "
    "rtol 1e-4, integer and bool outputs exact; shapes and dtypes must match; NaN equals NaN."
    "\n\nBoth raising the same exception type counts as agreement; one raising while the other "
    "returns is a disagreement, whichever side raised (the reforacle record's checker counted a "
    "reference exception as a pass). The first failing input of each function is printed as a "
    "Python expression with the call that rebuilds it from the seed."
)


@app.command(help=_CONFORM_HELP)
def conform(
    impl: str = typer.Argument(
        ..., help="Implementation under test: a module path (losslab.objectives) or a .py file."
    ),
    reference: str = typer.Option(
        ..., "--reference", "-r", help="Reference: a module path or a .py file."
    ),
    seed: int = typer.Option(
        0, help="Base seed; each case is seeded from (seed, function, label)."
    ),
    cases: int | None = typer.Option(
        None, "--cases", min=0, help="Random cases per function (default 5), plus its edge cases."
    ),
    function: list[str] | None = typer.Option(
        None, "--function", "-f", help="Only compare this function (repeatable)."
    ),
    json_out: str | None = typer.Option(
        None, "--json", help="Also write the full result to this JSON file (atomically)."
    ),
) -> None:
    """Compare every function IMPL and REFERENCE share on held-out inputs (see _CONFORM_HELP)."""
    from losslab.conformance.modules import conform_modules

    kwargs = {} if cases is None else {"cases_per_function": cases}
    try:
        result = conform_modules(impl, reference, seed=seed, functions=function or None, **kwargs)
    except ValueError as exc:  # unloadable module, unknown function name
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.summary())
    if json_out is not None:
        from pathlib import Path

        from losslab.runner.rundir import write_json_artifact

        write_json_artifact(Path(json_out), result.to_dict())
    raise typer.Exit(0 if result.passed else 1)


# --- preflight / golden: loss conformance against pinned references (losslab.conformance) ---


def _parse_sources_or_exit(source: list[str] | None) -> dict:
    from losslab.conformance.pinned import parse_sources

    try:
        return parse_sources(source or [])
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


_ALLOW_REDERIVATION_HELP = (
    "Where a pinned source cannot be had (offline and not cached, fetch failed), compare "
    "against losslab's re-derivation instead of failing; labelled 'pinned source NOT executed'."
)


@app.command()
def preflight(
    plan_file: str = typer.Argument(..., help="The plan JSON file (correctness_preflight.paths)."),
    source: list[str] | None = typer.Option(
        None,
        "--source",
        help="owner/repo=PATH: a git checkout (or bare git dir) to execute the pinned source "
        "from instead of fetching it; repeatable.",
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the JSON report here."),
    strict_sources: bool = typer.Option(
        False,
        "--strict-sources",
        help="Fail (exit 2) instead of falling back to the re-derivation when a named checkout "
        "lacks the pinned commit or its function cannot be extracted or run.",
    ),
    allow_rederivation: bool = typer.Option(
        False, "--allow-rederivation", help=_ALLOW_REDERIVATION_HELP
    ),
    offline: bool = typer.Option(
        False, "--offline", help="Never fetch: use --source checkouts and cached commits only."
    ),
) -> None:
    """Check our baseline and treatment losses against the plan's pinned baseline and reference
    revisions, in value and gradient, on set A and on the stress fixture. The pinned commit is
    fetched with git into losslab's cache unless --source names a checkout; exit 1 when any check
    fails, 2 when a pinned source cannot be had (see --allow-rederivation)."""
    from losslab.conformance.pinned import PinnedSourceError
    from losslab.conformance.preflight import PreflightError, run_preflight, write_report
    from losslab.conformance.render import render_preflight
    from losslab.plan import PlanError

    sources = _parse_sources_or_exit(source)
    try:
        result = run_preflight(
            plan_file,
            sources=sources,
            strict_sources=strict_sources,
            allow_rederivation=allow_rederivation,
            offline=offline,
        )
    except PlanError as exc:
        typer.echo(f"error: plan {plan_file} is not valid:\n{exc}", err=True)
        raise typer.Exit(2) from None
    except (PreflightError, PinnedSourceError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    render_preflight(result)
    if out is not None:
        typer.echo(f"report: {write_report(result, out)}")
    raise typer.Exit(0 if result["passed"] else 1)


@app.command()
def crosscheck(
    source: list[str] | None = typer.Option(
        None, "--source", help="owner/repo=PATH checkout to execute instead of fetching."
    ),
    revision: list[str] | None = typer.Option(
        None,
        "--revision",
        "-r",
        help="NAME=owner/repo@commit:path::function(...); repeatable (default: every "
        "registered framework's example revision plus convention variants).",
    ),
    fixture: str = typer.Option("stress", help="'stress' (default) or 'setA'."),
    family: str = typer.Option(
        "dppo",
        help="The loss family compared (losslab.conformance.LOSS_FAMILIES): every registered "
        "implementation of it; a --revision of another family is refused.",
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the matrix as JSON here."),
    html_out: str | None = typer.Option(None, "--html", help="Write an HTML page here."),
    allow_rederivation: bool = typer.Option(
        False, "--allow-rederivation", help=_ALLOW_REDERIVATION_HELP
    ),
    offline: bool = typer.Option(False, "--offline", help="Never fetch."),
) -> None:
    """Run one fixture through every registered implementation of a loss family (default: every
    DPPO implementation, from pinned sources) and losslab's matching configurations; print the
    pairwise matrix (tokens whose gradient differs / gradient cosine) and write it as JSON and
    HTML."""
    from losslab.conformance.crosscheck import crosscheck as run_crosscheck
    from losslab.conformance.crosscheck import write_html
    from losslab.conformance.fixtures import generate_fixture, stress_spec
    from losslab.conformance.pinned import PinnedSourceError
    from losslab.conformance.preflight import PreflightError, write_report
    from losslab.conformance.render import render_crosscheck
    from losslab.plan import RevisionError

    sources = _parse_sources_or_exit(source)
    if fixture not in ("stress", "setA"):
        typer.echo(f"error: --fixture {fixture!r}; expected 'stress' or 'setA'", err=True)
        raise typer.Exit(2)
    revisions = None
    if revision:
        revisions = []
        for item in revision:
            name, sep, text = item.partition("=")
            if not sep or "@" not in text:
                typer.echo(
                    f"error: --revision {item!r}: expected NAME=owner/repo@commit:...", err=True
                )
                raise typer.Exit(2)
            revisions.append((name, text))
    fx = generate_fixture(stress_spec() if fixture == "stress" else None)
    try:
        result = run_crosscheck(
            revisions,
            fx,
            sources,
            allow_rederivation=allow_rederivation,
            offline=offline,
            family=family,
        )
    except (PreflightError, PinnedSourceError, RevisionError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    render_crosscheck(result)
    if out is not None:
        typer.echo(f"json: {write_report(result, out)}")
    if html_out is not None:
        typer.echo(f"html: {write_html(result, html_out)}")


@app.command()
def atlas(
    source: list[str] | None = typer.Option(
        None, "--source", help="owner/repo=PATH checkout to execute instead of fetching."
    ),
    family: list[str] | None = typer.Option(
        None, "--family", help="Only these loss families (repeatable; default: all)."
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the atlas as JSON here."),
    markdown: str | None = typer.Option(
        None, "--markdown", help="Write the atlas as Markdown here (docs/atlas.md)."
    ),
    offline: bool = typer.Option(False, "--offline", help="Never fetch."),
) -> None:
    """Every registered loss x implementation, executed from pinned source (Tinker: documented
    formula), against losslab's matching configuration on set A and the atlas stress fixture:
    value and gradient equal?, tokens differing, cosine, and a named reason for each
    difference. Exit 1 when a row differs without a reason, 2 when a source cannot be had."""
    from losslab.atomic import atomic_write_text
    from losslab.conformance.atlas import render_markdown, run_atlas
    from losslab.conformance.pinned import PinnedSourceError
    from losslab.conformance.preflight import PreflightError, write_report
    from losslab.plan import RevisionError

    sources = _parse_sources_or_exit(source)
    try:
        result = run_atlas(
            sources,
            offline=offline,
            families=family or None,
            progress=lambda line: typer.echo(line, err=True),
        )
    except (PreflightError, PinnedSourceError, RevisionError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for row in result["rows"]:
        cells = row["cells"]
        agree = bool(cells) and all(
            c["value_agrees"] and c["gradient_agrees"] for c in cells.values()
        )
        status = "equal" if agree else (row["reason"] or "DIFFERS, no reason")
        typer.echo(f"{row['family']:>20} {row['name']:<28} {status}")
    s = result["summary"]
    typer.echo(
        f"{s['rows']} rows, {len(s['families'])} families, {len(s['frameworks'])} frameworks: "
        f"{len(s['equal_rows'])} equal, {len(s['reasoned_rows'])} with a reason, "
        f"{len(s['unexplained_rows'])} unexplained"
    )
    if out is not None:
        typer.echo(f"json: {write_report(result, out)}")
    if markdown is not None:
        typer.echo(f"markdown: {atomic_write_text(markdown, render_markdown(result) + chr(10))}")
    raise typer.Exit(1 if s["unexplained_rows"] else 0)


golden_app = typer.Typer(
    help="Golden files: reference losses and gradients on one fixture, as an interchange format.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(golden_app, name="golden")


@golden_app.command("check")
def golden_check(
    file: str = typer.Argument(..., help="A golden file (tinker_ppo_and_dppo_seed0.json format)."),
    loss_tol: float = typer.Option(
        1e-6, "--loss-tol", help="Max |loss error| / float64_check.loss_term_abs_sum_float64."
    ),
    grad_tol: float = typer.Option(
        1e-6, "--grad-tol", help="Max |gradient error| / max(1, |g|) over every token."
    ),
    json_out: str | None = typer.Option(None, "--json", help="Also write the result as JSON."),
) -> None:
    """Recompute every output of FILE with losslab's re-derivation of its reference; exit 1 on
    any failure or on an output that cannot be mapped to a known reference."""
    from losslab.conformance.golden import GoldenFileError, check_golden
    from losslab.conformance.preflight import write_report
    from losslab.conformance.render import render_golden

    try:
        result = check_golden(file, loss_tolerance=loss_tol, grad_tolerance=grad_tol)
    except (GoldenFileError, ValueError) as exc:
        text = str(exc)
        typer.echo(f"error: {text if file in text else f'{file}: {text}'}", err=True)
        raise typer.Exit(2) from None
    render_golden(result)
    if json_out is not None:
        write_report(result.to_dict(), json_out)
    raise typer.Exit(0 if result.passed else 1)


@golden_app.command("make")
def golden_make(
    revision: list[str] = typer.Option(
        ..., "--revision", "-r", help="owner/repo@commit:path::function(kw=value, ...); repeatable."
    ),
    out: str = typer.Option(..., "--out", "-o", help="The golden file to write."),
    source: list[str] | None = typer.Option(
        None,
        "--source",
        help="owner/repo=PATH checkout to execute the pinned source from (default: the pinned "
        "commit fetched into losslab's cache).",
    ),
    seed: int = typer.Option(0, help="Fixture seed (the other generator parameters: set A)."),
    stress: bool = typer.Option(
        False, "--stress", help="Use the stress fixture (old != sampler, r > c, |log r| > 20)."
    ),
    rederive: bool = typer.Option(
        False,
        "--rederive",
        help="Where the pinned source cannot be had (no --source, fetch failed), write "
        "losslab's re-derivation (labelled so).",
    ),
) -> None:
    """Write a golden file with one output per --revision, computed by executing the pinned
    source from the named checkout, so references computed elsewhere can be carried along."""
    import dataclasses

    from losslab.conformance.fixtures import FixtureSpec, stress_spec
    from losslab.conformance.golden import make_golden
    from losslab.conformance.pinned import PinnedSourceError

    sources = _parse_sources_or_exit(source)
    try:
        spec = dataclasses.replace(stress_spec(), seed=seed) if stress else FixtureSpec(seed=seed)
        data = make_golden(revision, sources, out, spec=spec, allow_rederivation=rederive)
    except (ValueError, PinnedSourceError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for name, entry in data["outputs"].items():
        typer.echo(f"{name}: loss {entry['loss']:.6g} ({entry['reference']['kind']})")
    typer.echo(f"wrote {out}")


# --- run / report: the experiment runner and its report (losslab.runner, losslab.report) ---


@app.command()
def run(
    plan: str = typer.Argument(..., help="The experiment plan (JSON file)."),
    backend: str = typer.Option(
        DEFAULT_BACKEND,
        "--backend",
        "-b",
        help=". ".join(f"{name}: {about}" for name, (_, about) in BACKENDS.items()) + ".",
    ),
    out: str | None = typer.Option(
        None, "--out", "-o", help="New run directory (default runs/<plan name>-<UTC time>)."
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Continue this run directory from its last completed step."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Continue past a failed preflight, gate, feasibility or config check "
        "(the report flags every override).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Plain log lines, no progress bars."),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Folder with the task's data (GSM8K: train.jsonl and test.jsonl) when the "
        "Hugging Face hub is out of reach; offline tasks ignore it.",
    ),
    rehearse: bool = typer.Option(
        False,
        "--rehearse",
        help="Dress rehearsal: every phase of PLAN at toy scale on the CPU, on a random model "
        "of the plan's architecture (minutes). Catches crashes before GPU hours are spent; "
        "its verdict is not evidence and its run directory cannot be resumed as a real run.",
    ),
    source: list[str] | None = typer.Option(
        None,
        "--source",
        help="owner/repo=PATH: a git checkout (or bare git dir) to read a pinned reference or an "
        "arm's pinned loss function from instead of fetching it; repeatable. Without it an "
        "offline run re-derives the reference, and the console and report say so.",
    ),
    tracker: str | None = typer.Option(
        None,
        "--tracker",
        help="Mirror metrics.jsonl to 'wandb' or 'trackio' (must be installed; their offline "
        "modes, e.g. WANDB_MODE=offline, apply). Off by default.",
    ),
) -> None:
    """Run PLAN end to end (preflights, pilot, gate, both arms, evaluation, verdict, report).

    Each phase writes its artifact into the run directory; `--resume` continues a killed run.

    Exit codes: 0 done, 1 run error, 2 bad input (plan, run directory, resume, data), 3 a check
    failed, 4 backend unreachable, 70 a bug (a crash file is named), 130 interrupted, 143
    terminated by SIGTERM (after 130/143 the run directory stays resumable).
    """
    from pathlib import Path

    from losslab.plan import PlanError
    from losslab.runner import RunError, run_plan

    if backend not in BACKENDS:
        names = ", ".join(map(repr, BACKENDS))
        typer.echo(f"error: --backend {backend!r}: expected one of {names}", err=True)
        raise typer.Exit(2)
    if out is not None and resume is not None:
        typer.echo("error: pass either --out (a new run) or --resume (an existing one)", err=True)
        raise typer.Exit(2)
    sources = _parse_sources_or_exit(source)
    try:
        run_plan(
            Path(plan),
            backend=backend,
            out=Path(out) if out else None,
            resume=Path(resume) if resume else None,
            force=force,
            quiet=quiet,
            data=Path(data) if data else None,
            rehearse=rehearse,
            tracker=tracker,
            sources=sources,
        )
    except PlanError as e:
        typer.echo(f"error: plan {plan} is not valid:\n{e}", err=True)
        raise typer.Exit(2) from None
    except RunError as e:
        from losslab.runner.rundir import redact
        from losslab.runner.signals import exit_now_if_signalled

        typer.echo(redact(f"error: {e}"), err=True)
        exit_now_if_signalled(e.exit_code)  # after Ctrl-C/SIGTERM: no slow interpreter shutdown
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:
        from losslab.runner.signals import (
            exit_now_if_signalled,
            interrupt_exit_code,
            interrupt_name,
        )

        typer.echo(f"{interrupt_name(e)} before the run directory was created", err=True)
        exit_now_if_signalled(interrupt_exit_code(e))
        raise typer.Exit(interrupt_exit_code(e)) from None
    # the runner itself logged "verdict: ..." and "report: ..." (terminal and run.log)


@app.command()
def report(
    run_dir: str = typer.Argument(..., help="A run directory made by `losslab run`."),
) -> None:
    """Rebuild report.json and report.html from RUN_DIR's artifacts (works for stopped runs)."""
    from pathlib import Path

    from losslab.report import build_report
    from losslab.runner.errors import RunDirError
    from losslab.runner.lock import acquire_shared

    try:
        # shared: reports may run side by side, never while a run rewrites the artifacts
        lock = acquire_shared(Path(run_dir)) if Path(run_dir).is_dir() else None
    except RunDirError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        paths = build_report(Path(run_dir))
    except RunDirError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except FileNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a hand-edited artifact
        typer.echo(f"error: cannot read the artifacts in {run_dir}: {e}", err=True)
        raise typer.Exit(2) from None
    finally:
        if lock is not None:
            lock.release()
    typer.echo(f"report: {paths.html_path.resolve()}")
    typer.echo(f"facts: {paths.json_path.resolve()}")


# --- compare: the paired verdict from two per-item result files (losslab.stats.compare) ---


@app.command()
def compare(
    a: str = typer.Argument(..., help="Treatment's per-item results (positive weight)."),
    b: str = typer.Argument(..., help="Baseline's per-item results, on the same items."),
    plan: str | None = typer.Option(
        None, "--plan", help="Use this plan's decision rule (else the rule given by the options)."
    ),
    method: str | None = typer.Option(None, "--method", help="Decision method: paired_hoeffding."),
    alpha: float | None = typer.Option(None, "--alpha", help="Two-sided level (default 0.05)."),
    margin: float | None = typer.Option(
        None,
        "--margin",
        help="Pre-registered margin on A minus B (default 0; < 0: non-inferiority).",
    ),
    metric: str | None = typer.Option(
        None,
        "--metric",
        help="Criterion metric of a losslab eval file: accuracy (field correct), reward, format "
        "(default accuracy). An lm-eval file's value stands in for it.",
    ),
    lm_eval_metric: str | None = typer.Option(
        None, "--lm-eval-metric", help="lm-eval per-item metric (exact_match, acc, ...)."
    ),
    lm_eval_filter: str | None = typer.Option(
        None, "--filter", help="lm-eval filter (strict-match, flexible-extract, none, ...)."
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Write the verdict record (JSON)."),
) -> None:
    """The paired verdict on A minus B from two per-item result files.

    Each file is a losslab eval file (eval_<arm>.jsonl; items by `id`) or lm-evaluation-harness
    `--log_samples` output (samples_<task>_<date>.jsonl; items by `doc_id`; name the metric and
    filter when the file holds several). Files that score different items are refused, naming
    the first item only one has. Exit codes: 0 a verdict (validated, refuted or inconclusive),
    2 bad input.
    """
    from losslab.atomic import atomic_write_json
    from losslab.stats.compare import command_line_rule, compare_files, summary_lines

    rule_options = {"--method": method, "--alpha": alpha, "--margin": margin, "--metric": metric}
    given = [name for name, value in rule_options.items() if value is not None]
    loaded = None
    try:
        if plan is not None:
            if given:
                raise ValueError(
                    f"pass either --plan or a rule ({', '.join(given)}), not both: the plan's "
                    "decision rule is the pre-registered one"
                )
            from losslab.plan import load_plan

            loaded = load_plan(plan)
            rule = loaded.decision_rule
        else:
            rule = command_line_rule(
                method=method or "paired_hoeffding",
                alpha=0.05 if alpha is None else alpha,
                margin=0.0 if margin is None else margin,
                metric=metric or "accuracy",
            )
        record = compare_files(
            a, b, rule, plan=loaded, lm_eval_metric=lm_eval_metric, lm_eval_filter=lm_eval_filter
        )
    except ValueError as e:  # PlanError, ItemMismatch, a damaged or unknown file
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo("\n".join(summary_lines(record)))
    if out is not None:
        typer.echo(f"wrote {atomic_write_json(out, record, indent=1)}")


if __name__ == "__main__":  # pragma: no cover
    app()

"""`losslab run`: the phase table of `losslab.runner.phases`, in order, each leaving its artifact.

    correctness preflight -> restoration preflight -> pilot (first k steps of the treatment arm)
    -> feasibility projection from the pilot's measured timings -> activation gate on the pilot
    -> both arms -> evaluation (the base model once, then each arm) -> decision rule -> report

With several seeds in decision_rule.seeds, "both arms" is one pair of arms per seed (the
schedule's units); everything else is the same.

The runner owns the order, resume, the checkpoints, the lock (via `RunDir`) and the one
metrics.jsonl writer; each phase owns its checks (`losslab.checks.PhaseResult`). A phase
recorded as done in manifest.json whose files are intact is skipped, and training continues from
each arm's newest checkpoint; that is all `--resume` does. A failed check stops the run with a
message naming the check, the measured value and the bound, unless `force`.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from losslab.artifacts import ArtifactError, verify_ledger
from losslab.backends import DEFAULT_BACKEND
from losslab.checks import PhaseResult
from losslab.engine.rl import train_steps
from losslab.runner.artifacts import DamagedArtifact, read_object, read_rows, set_aside
from losslab.runner.checkpoint import (
    Checkpoint,
    capture_rng,
    completed_steps,
    newest_intact_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
    seed_everything,
)
from losslab.runner.errors import CheckFailed, DiskFull, RunDirError, RunError
from losslab.runner.phases import TRAINING_PHASE, VERDICT_PHASE
from losslab.runner.progress import RunConsole
from losslab.runner.protocols import ArmTrainer, Components, Phase, check_table
from losslab.runner.rundir import (
    BASE_MODEL,
    RunDir,
    atomic_write_jsonl,
    open_run_dir,
    redact,
    write_json_artifact,
)
from losslab.runner.signals import interrupt_exit_code, interrupt_name, sigterm_as_interrupt
from losslab.runner.startup import check_start_environment
from losslab.runner.trackers import MetricsMirror, open_tracker

KEEP_CHECKPOINTS = 2  # newest two per arm: resume needs one, the other guards a bad disk write

ComponentsFactory = Callable[[Path, str], Components]


class RunInterrupted(RunError):
    """Ctrl-C or SIGTERM: the run directory is left resumable (exit 130, or 143 for SIGTERM)."""

    exit_code = 130

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    verdict: dict[str, Any] | None
    report_html: Path | None


def run_plan(
    plan_file: Path,
    *,
    backend: str = DEFAULT_BACKEND,
    out: Path | None = None,
    resume: Path | None = None,
    force: bool = False,
    quiet: bool = False,
    data: Path | None = None,
    components_factory: ComponentsFactory | None = None,
    rehearse: bool = False,
    tracker: str | None = None,
    sources: Mapping[str, Path] | None = None,
) -> RunResult:
    """Run (or resume) the experiment in `plan_file`; returns the run directory and verdict.

    Args:
        plan_file: the plan JSON. On `resume` it must be the same file content as the run's.
        backend: a `losslab.backends.BACKENDS` name (default: the first, the embedded model).
        out: new run directory (default runs/<plan>-<UTC time>); must be absent or empty.
        resume: an existing run directory to continue from its last completed step.
        force: continue past a failed preflight, gate, feasibility or config check; the
            report flags every check that was overridden.
        quiet: plain log lines instead of progress bars.
        data: a folder with the task's data files (GSM8K: train.jsonl and test.jsonl) for
            machines without the Hugging Face hub or cache; offline tasks ignore it.
        components_factory: builds the run's `Components` (its resources and phase table)
            from (plan file, backend); tests pass a fake. Default: losslab's own packages.
        rehearse: a dress rehearsal (`runner.rehearsal`): every phase of the plan at toy scale
            on a random model of its architecture, on the CPU; never stops at a failed check;
            its directory is marked REHEARSAL and can never be resumed as a real run.
        tracker: "wandb" or "trackio" mirrors every metrics.jsonl row to that tracker (its own
            offline settings apply); None (default) logs to the run directory only. Do not use
            it for runs whose metrics must stay on this machine with wandb online.
        sources: `{"owner/repo": checkout}` (`--source`): the pinned references and an arm's
            pinned loss function are read from these checkouts instead of losslab's cache; a
            reference that still cannot be had is re-derived, and the console and report say so.

    Raises:
        RunError (and subclasses), PlanError: with a message fit for the user.
    """
    with sigterm_as_interrupt():  # a scheduler's SIGTERM unwinds like Ctrl-C
        plan_file = Path(plan_file)
        check_start_environment(backend)  # a short key, a bad timeout: refused before any work
        if not plan_file.exists():  # a FIFO, /dev/zero, a folder: the plan reader refuses
            # them (exit 2, "not a regular file"; losslab.plan.files) without opening them
            raise RunError(f"plan file {plan_file} does not exist")
        factory = components_factory or _default_factory(data, rehearse, sources)
        components = factory(plan_file, backend)  # validates the plan before any write
        if BASE_MODEL in components.schedule.arms:
            raise RunError(
                f"an arm is named {BASE_MODEL!r}, the name of the initial policy's evaluation "
                f"(eval_{BASE_MODEL}.jsonl); rename the arm"
            )
        rehearsal = getattr(components, "rehearsal", None) if rehearse else None
        mirror = open_tracker(tracker)  # a missing tracker package fails before any write
        # a rehearsal reaches every phase (force); each check's outcome is still recorded
        how = dict(backend=backend, force=force or rehearse, rehearsal=rehearsal)
        # the arms' losses are built now: code that does not import or has the wrong form
        # stops the run here, before any run directory exists (exit 2)
        loss_code = {
            arm: dict(fn.code)
            for arm, fn in (getattr(components, "losses", None) or {}).items()
            if getattr(fn, "code", None)
        }
        # each prompt plus the tokens the plan lets the model write must fit the model's
        # context: checked now that model and data are known, before any run directory (exit 2)
        check_prompts = getattr(components, "check_prompts", None)
        if check_prompts is not None:
            check_prompts()
        run = open_run_dir(
            plan_file,
            out=out,
            resume=resume,
            loss_code=loss_code,
            units=components.schedule.arms,
            **how,
        )
        command = f"losslab run {plan_file} --backend {backend}" + (" --rehearse" * rehearse)
        intro = [f"{command}: {'resuming' if resume else 'run directory'} {run.root}"]
        if rehearsal is not None:
            model = rehearsal["model"]
            intro += [
                rehearsal["note"],
                f"rehearsal model: {model['architecture']}",
                f"rehearsal tokenizer: {model['tokenizer']}",
            ]
        return _run_in(run, components, intro, f"{command} --resume {run.root}", quiet, mirror)


def _default_factory(
    data: Path | None, rehearse: bool, sources: Mapping[str, Path] | None = None
) -> ComponentsFactory:
    if rehearse:
        from losslab.runner.rehearsal import RehearsalComponents

        return partial(RehearsalComponents, data=data, sources=sources)
    from losslab.runner.components import DefaultComponents

    return partial(DefaultComponents, data=data, sources=sources)


def _run_in(
    run: RunDir,
    components: Components,
    intro: list[str],
    resume_hint: str,
    quiet: bool,
    mirror: MetricsMirror | None,
) -> RunResult:
    """Run the phases in the opened `run` directory, logging `intro` first; every way out
    leaves it resumable and released, with a line in run.log saying how it ended."""
    console: RunConsole | None = None
    runner: _Runner | None = None
    threads = torch.get_num_threads()  # a resume may pin it to the original run's; restored below
    try:
        phases = check_table(components.phases)
        if mirror is not None:
            mirror.start(run.root.name, run.identity)
        console = RunConsole(run.log_path, quiet=quiet, total_phases=len(phases) + 1)
        for line in intro:
            console.log(line)
        runner = _Runner(run, components, phases, console, run.force, mirror)
        return runner.run()
    except KeyboardInterrupt as e:
        what = interrupt_name(e)
        _log_quietly(console, f"{what}; the run directory is resumable: {resume_hint}")
        # manifest only: a scheduler's SIGTERM grace is short, and `losslab report` (or the
        # resumed run) builds the report that names this stop
        _record_stop(runner, "interrupted", f"{what}; resumable: {resume_hint}", report=False)
        raise RunInterrupted(f"{what}. Continue with: {resume_hint}", interrupt_exit_code(e)) from e
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(
                f"no space left on the device while writing {e.filename or run.root}; the run "
                f"directory is resumable. Free space, then continue with: {resume_hint}"
            ) from e
        raise
    except CheckFailed as e:
        _record_stop(runner, "failed check", e.summary, report=False)  # its report is built
        raise
    except RunError as e:
        _log_quietly(console, f"stopped: {e}")
        _record_stop(runner, "stopped", str(e))
        raise
    except Exception as e:  # a bug: keep the traceback, but leave a trace in run.log too
        _log_quietly(
            console,
            f"crashed: {type(e).__name__}: {e}; the run directory is resumable: {resume_hint}",
        )
        _record_stop(runner, "crashed", f"{type(e).__name__}: {e}; resumable: {resume_hint}")
        raise
    finally:
        if mirror is not None:
            mirror.close()
        if console is not None:
            console.close()
        run.release()
        torch.set_num_threads(threads)


def _record_stop(runner: _Runner | None, kind: str, reason: str, report: bool = True) -> None:
    """Write why the run ended early into the manifest (`stop`: kind, reason, the phase that was
    running) and rebuild the report so it says so; never masks the error being raised."""
    if runner is None:
        return
    try:
        manifest = runner.run_dir.read_manifest()
        manifest["stop"] = {"kind": kind, "reason": redact(reason), "phase": runner.current_phase}
        runner.run_dir.write_manifest(manifest)
    except (OSError, RunError):  # a full disk or a damaged manifest: the log line stays
        return
    if report:
        runner._report(quiet_fail=True)


def _log_quietly(console: RunConsole | None, message: str) -> None:
    """Log a last line if the log can still be written (not on a full disk)."""
    if console is None:
        return
    try:
        console.log(message)
    except OSError:
        pass


class _Runner:
    """One run of the phase table: order, resume, checkpoints and the metrics writer.

    It is the `PhaseContext` every phase runs in (`losslab.runner.protocols`).
    """

    def __init__(
        self,
        run: RunDir,
        comp: Components,
        phases: tuple[Phase, ...],
        console: RunConsole,
        force: bool,
        mirror: MetricsMirror | None = None,
    ) -> None:
        self.run_dir, self.comp, self.phases = run, comp, phases
        self.console, self.force, self.mirror = console, force, mirror
        self.schedule = comp.schedule
        self.current_phase: str | None = None  # named in the manifest's `stop` of a stopped run

    def run(self) -> RunResult:
        self._write_environment()
        self._set_aside_damaged()
        for phase in self.phases:
            self._run_phase(phase)
        self.current_phase = "report"
        html = self._report()
        verdict = None
        decision = next((p for p in self.phases if p.name == VERDICT_PHASE and p.artifact), None)
        if decision is not None and decision.artifact:
            verdict = read_object(self.path(decision.artifact))
            line = self.record(decision.name).get("summary")  # the verdict line
            if line:
                self.console.log(line)
        self.console.log(f"report: {html.resolve()}")
        return RunResult(self.run_dir.root, verdict, html)

    # --- the phase table -----------------------------------------------------------------------
    def _run_phase(self, phase: Phase) -> None:
        """Run one phase, or skip it when recorded done with its files intact (resume)."""
        done = self.record(phase.name).get("status") in ("done", "forced")
        if phase.name == TRAINING_PHASE and done:
            done = self._final_checkpoints_intact()
        if done and all(self.intact(self.path(f)) for f in phase.files(self.schedule)):
            self.console.skip_phase(phase.name, "already done (resume)")
            return
        t0 = time.perf_counter()
        self.current_phase = phase.name
        with self.console.phase(phase.name):
            result = phase.run(self)
            if not result.passed and self.force:
                result = result.overridden()
            if phase.artifact:
                write_json_artifact(self.path(phase.artifact), result.record())
                self.run_dir.record_artifact(self.path(phase.artifact))
            if result.summary:
                self.console.log(f"[{phase.name}] {result.summary}")
        # a phase without a file keeps its record in its manifest entry (the pilot's facts)
        info = {} if phase.artifact else dict(result.record())
        info.update(seconds=time.perf_counter() - t0, summary=result.summary)
        if phase.artifact:
            info["artifact"] = phase.artifact
        self._judge(phase.name, result, phase.artifact or "manifest.json", info)

    def _set_aside_damaged(self) -> None:
        """Set aside each artifact that no longer matches the manifest's ledger (cut, edited,
        deleted), naming it, so the phases that made it recompute it (`_run_phase`)."""
        for path, why in verify_ledger(self.run_dir.root, self.run_dir.read_manifest()):
            if path.name == "plan.json":
                continue  # restored from the plan given when the directory was reopened
            if path.exists() or path.is_symlink():
                aside = set_aside(path)
                self.console.log(f"{path} is damaged: {why}; set aside as {aside.name}")
            else:
                self.console.log(f"{path} is damaged: {why}")
            self.run_dir.forget_artifact(path)

    def _final_checkpoints_intact(self) -> bool:
        """Whether every unit's newest intact checkpoint is its final one (damaged ones are
        named in the log by `checkpoint`)."""
        finals = [self.checkpoint(arm) for arm in self.schedule.arms]
        return all(ck is not None and ck.step == self.schedule.steps for ck in finals)

    def _judge(self, name: str, result: PhaseResult, artifact: str, info: dict[str, Any]) -> None:
        """Record a phase's outcome; stop on its first failed check unless --force."""
        failed = result.first_failure
        if failed is None:
            self.run_dir.mark_phase(name, "done", **info)
            return
        err = CheckFailed(name, failed.name, failed.measured, str(failed.bound), artifact)
        if self.force:
            self.run_dir.mark_phase(name, "forced", message=err.summary, **info)
            self.console.log(f"WARNING --force continues past: {err.summary}")
            return
        self.run_dir.mark_phase(name, "failed", message=str(err), **info)
        self.console.log(f"stopped: {err}")
        self._report(quiet_fail=True)
        raise err

    def _write_environment(self) -> None:
        """Record the environment on the first run; on resume, pin torch's thread count to the
        recorded one (float reductions depend on it, and resume must reproduce the run)."""
        manifest = self.run_dir.read_manifest()
        recorded = manifest.get("environment")
        if recorded is None:
            manifest["environment"] = {
                **self.comp.environment(),
                "torch_threads": torch.get_num_threads(),
            }
        else:
            threads = recorded.get("torch_threads")
            if isinstance(threads, int) and threads != torch.get_num_threads():
                self.console.log(
                    f"resume: using {threads} torch threads as the original run did "
                    f"(this process had {torch.get_num_threads()}), so results stay identical"
                )
                torch.set_num_threads(threads)
        if "stop" in manifest:  # this attempt continues it: the old reason moves to the history
            manifest.setdefault("previous_stops", []).append(manifest.pop("stop"))
        manifest["phase_order"] = [p.name for p in self.phases]
        sched = self.schedule
        manifest["schedule"] = {
            "arms": list(sched.arms),
            "treatment": sched.treatment,
            "steps": sched.steps,
            "pilot_steps": sched.pilot_steps,
            "seeds": sched.seeds,
            "units": {u: {"arm": sched.plan_arm(u), "seed": sched.seeds[u]} for u in sched.arms},
        }
        self.run_dir.write_manifest(manifest)

    # --- what a phase reads (PhaseContext) ------------------------------------------------------
    def log(self, message: str) -> None:
        self.console.log(message)

    def path(self, relative: str) -> Path:
        return self.run_dir.under(relative)

    def record(self, phase: str) -> dict[str, Any]:
        return self.run_dir.read_manifest().get("phases", {}).get(phase, {})

    def intact(self, path: Path) -> bool:
        """Whether `path` reads back with its schema (JSON lines for .jsonl, else one object);
        a damaged file is named, set aside as `<name>.damaged` and recomputed by the caller."""
        try:
            (read_rows if path.suffix == ".jsonl" else read_object)(path)
            why = self.run_dir.ledger_problem(path)  # cut to fewer rows, edited, replaced
            if why is not None:
                raise DamagedArtifact(path, why)
            return True
        except DamagedArtifact as e:
            if path.exists() or path.is_symlink():
                aside = set_aside(path)
                self.console.log(f"{e}; set aside as {aside.name}")
            self.run_dir.forget_artifact(path)
            return False

    def write_rows(self, path: Path, rows: list[dict[str, Any]]) -> None:
        """Write a JSON-lines artifact and enter it in the manifest's ledger."""
        atomic_write_jsonl(path, rows)
        self.run_dir.record_artifact(path)

    def metrics_rows(self, arm: str) -> list[dict[str, Any]]:
        """The arm's metrics.jsonl; a damaged one is rebuilt from its checkpoint (same rows)."""
        path = self.run_dir.metrics_path(arm)
        if not self.intact(path):
            ck = self.checkpoint(arm)
            if ck is None:
                raise RunDirError(f"{path} is damaged and arm {arm} has no intact checkpoint")
            self.write_rows(path, ck.metrics)
            self.console.log(f"rebuilt {path.name} of {arm} from checkpoint {ck.path.name}")
        return read_rows(path)

    def pilot_rows(self) -> list[dict[str, Any]]:
        return self.metrics_rows(self.schedule.treatment)[: self.schedule.pilot_steps]

    def executed(self, arm: str) -> dict[str, Any]:
        return self._executed_record().get(arm, {})

    def _executed_record(self) -> dict[str, Any]:
        path = self.run_dir.executed_config_path
        return read_object(path) if path.is_file() and self.intact(path) else {}

    def checkpoint(self, arm: str) -> Checkpoint | None:
        """The arm's newest intact checkpoint; each newer damaged one is named in the log."""
        ck, damaged = newest_intact_checkpoint(self.run_dir.checkpoints_dir(arm))
        for path, why in damaged:
            self.console.log(f"{arm}: checkpoint {path.name} is damaged ({why}); skipped")
        if damaged:
            fallback = f"checkpoint {ck.path.name}" if ck else "the start (no intact checkpoint)"
            self.console.log(f"{arm}: falling back to the newest intact one: {fallback}")
        return ck

    # --- the report ------------------------------------------------------------------------------
    def _report(self, quiet_fail: bool = False) -> Path:
        from losslab.report import build_report

        t0 = time.perf_counter()
        if quiet_fail:  # a stopped run still gets a report that shows why it stopped
            try:
                path = build_report(self.run_dir.root).html_path
                self.console.log(f"report of the stopped run: {path.resolve()}")
            except Exception as e:  # the stop message matters more than the report
                self.console.log(f"could not build the report of the stopped run: {e}")
                path = self.run_dir.report_html_path
            return path
        with self.console.phase("report"):
            # before the report reads them: rebuild damaged metrics; a damaged executed-config
            # record is set aside (the report shows it as absent; the log names it). The phases'
            # artifacts were verified, and recomputed if damaged, by `_run_phase`
            for arm in self.schedule.arms:
                trained = bool(completed_steps(self.run_dir.checkpoints_dir(arm)))
                if self.run_dir.metrics_path(arm).exists() or trained:
                    self.metrics_rows(arm)
            self._executed_record()
            try:
                paths = build_report(self.run_dir.root)
            except ArtifactError as e:  # changed while this run read it: named, exit 2
                raise DamagedArtifact(e.path, e.why) from None
        self.run_dir.mark_phase("report", "done", seconds=time.perf_counter() - t0)
        return paths.html_path

    # --- training with per-step checkpoints ------------------------------------------------------
    def open_trainer(self, arm: str) -> ArmTrainer:
        """Seed, create the arm's trainer, and record + check its executed configuration."""
        seed_everything(self.schedule.seeds[arm])
        trainer = self.comp.make_trainer(arm)
        recorded = self._executed_record()
        if arm not in recorded:
            result = self.comp.executed_config(arm, trainer)
            if not result.passed and self.force:
                result = result.overridden()
            recorded[arm] = result.artifact
            path = self.run_dir.executed_config_path
            write_json_artifact(path, recorded)
            self.run_dir.record_artifact(path)
            if not result.passed:
                try:
                    self._judge("executed_config", result, path.name, {})
                except CheckFailed:
                    trainer.close()
                    raise
        return trainer

    def train(
        self,
        arm: str,
        until: int,
        before_close: Callable[[ArmTrainer], None] | None = None,
    ) -> float:
        """Train `arm` up to `until` completed steps, checkpointing after every step; the
        seconds it took to set the trainer up.

        `before_close(trainer)` runs on the trained state before the trainer is released (the
        pilot times a few evaluation items there); it runs after the last checkpoint, so it
        cannot change what a resumed run computes.
        """
        ckdir = self.run_dir.checkpoints_dir(arm)
        ck = self.checkpoint(arm)
        start = ck.step if ck else 0
        if ck is not None:  # the checkpoint is the truth; a kill may have come before this write
            self.write_rows(self.run_dir.metrics_path(arm), ck.metrics)
        if start >= until and before_close is None:
            self.console.log(f"{arm}: {start} steps already done (resume)")
            return 0.0
        t_setup = time.perf_counter()
        trainer = self.open_trainer(arm)
        rows: list[dict[str, Any]] = []
        if ck is not None:
            trainer.load(ck.trainer_dir, ck.trainer, ck.cursor)
            restore_rng(ck.rng)
            rows = list(ck.metrics)
            self.console.log(f"{arm}: continuing from checkpoint step {ck.step}")
        setup_s = time.perf_counter() - t_setup
        try:
            # a redone pilot of an arm already past it (its diagnostics file was damaged) trains
            # nothing: `before_close` times the newest checkpoint's weights
            with self.console.steps(arm, min(start, until), until) as bar:
                # the engine's one arm loop; after each step: checkpoint, then metrics.jsonl
                for row in train_steps(trainer, min(start, until), until, arm=arm):
                    i = row["step"]
                    row.update(self._efficiency_eval(arm, trainer, i + 1))
                    rows.append(row)
                    save_checkpoint(
                        ckdir, i + 1, cursor=trainer.cursor, metrics=rows, save_trainer=trainer.save
                    )
                    self.write_rows(self.run_dir.metrics_path(arm), rows)
                    if self.mirror is not None:
                        self.mirror.log(arm, row)
                    prune_checkpoints(ckdir, KEEP_CHECKPOINTS, protect={self.schedule.steps})
                    bar.done(i, row["time/step_s"], _step_summary(row))
            if before_close is not None:
                before_close(trainer)
        finally:
            trainer.close()
        return setup_s

    def _efficiency_eval(self, arm: str, trainer: ArmTrainer, done: int) -> dict[str, Any]:
        """The efficiency endpoint after `done` completed steps (`engine.eval_every`): accuracy
        on the first test items, kept in the step's metrics row (so a checkpoint and a resume
        carry it). The RNG state is put back, so evaluating never changes what training draws."""
        every = getattr(self.comp, "efficiency", None)
        if not every or done % every[0]:
            return {}
        rng, t0 = capture_rng(), time.perf_counter()
        try:
            items = self.comp.evaluate_subset(arm, trainer, every[1])
        finally:
            restore_rng(rng)
        correct = sum(bool(r.get("correct")) for r in items)
        return {
            "efficiency/accuracy": correct / len(items) if items else None,
            "efficiency/items": len(items),
            "efficiency/eval_s": time.perf_counter() - t0,
        }


def _step_summary(row: dict[str, Any]) -> str:
    keys = ("reward/mean", "loss/clip_fraction", "policy/drift_vs_sampler_q90")
    return " ".join(f"{k}={row[k]:.4g}" for k in keys if isinstance(row.get(k), int | float))

"""`losslab run`: the phases of one experiment, in order, each leaving its artifact.

    correctness preflight -> restoration preflight -> pilot (first k steps of the treatment arm)
    -> feasibility projection from the pilot's measured timings -> activation gate on the pilot
    -> both arms -> evaluation (the base model once, then each arm) -> decision rule -> report

With several seeds in decision_rule.seeds, "both arms" is one pair of arms per seed (the
schedule's units); everything else is the same.

A phase whose artifact is already recorded as done in manifest.json is skipped, and training
continues from each arm's newest checkpoint; that is all `--resume` does. A failed check stops
the run with a message naming the check, the measured value and the bound, unless `force`.
"""

from __future__ import annotations

import datetime as _dt
import errno
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.backends import DEFAULT_BACKEND
from losslab.engine.rl import train_steps
from losslab.runner.artifacts import DamagedArtifact, read_object, read_rows, set_aside
from losslab.runner.checkpoint import (
    Checkpoint,
    newest_intact_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from losslab.runner.errors import CheckFailed, RunDirError, RunError
from losslab.runner.progress import RunConsole
from losslab.runner.protocols import ArmTrainer, Components
from losslab.runner.rundir import (
    BASE_MODEL,
    PHASES,
    RunDir,
    atomic_write_jsonl,
    write_json_artifact,
)
from losslab.runner.signals import interrupt_exit_code, interrupt_name, sigterm_as_interrupt
from losslab.runner.trackers import MetricsMirror, open_tracker

KEEP_CHECKPOINTS = 2  # newest two per arm: resume needs one, the other guards a bad disk write
EVAL_SEED_OFFSET = 1_000_003  # eval RNG stream differs from training's, same for every arm

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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(plan_file: Path, rehearsal: bool = False) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    kind = "-REHEARSAL" if rehearsal else ""
    return Path("runs") / f"{Path(plan_file).stem}{kind}-{stamp}"


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
        components_factory: builds the phases' `Components` from (plan file, backend); tests
            pass a fake. Default: losslab's own packages.
        rehearse: a dress rehearsal (`runner.rehearsal`): every phase of the plan at toy scale
            on a random model of its architecture, on the CPU; never stops at a failed check;
            its directory is marked REHEARSAL and can never be resumed as a real run.
        tracker: "wandb" or "trackio" mirrors every metrics.jsonl row to that tracker (its own
            offline settings apply); None (default) logs to the run directory only. Do not use
            it for runs whose metrics must stay on this machine with wandb online.

    Raises:
        RunError (and subclasses), PlanError: with a message fit for the user.
    """
    with sigterm_as_interrupt():  # a scheduler's SIGTERM unwinds like Ctrl-C
        return _run_plan(
            plan_file,
            backend,
            out,
            resume,
            force,
            quiet,
            data,
            components_factory,
            rehearse,
            tracker,
        )


def _run_plan(
    plan_file: Path,
    backend: str,
    out: Path | None,
    resume: Path | None,
    force: bool,
    quiet: bool,
    data: Path | None,
    components_factory: ComponentsFactory | None,
    rehearse: bool,
    tracker: str | None,
) -> RunResult:
    plan_file = Path(plan_file)
    if not plan_file.is_file():
        raise RunError(f"plan file {plan_file} does not exist")
    if components_factory is None:
        from functools import partial

        from losslab.runner.components import DefaultComponents

        components_factory = partial(DefaultComponents, data=data)
        if rehearse:
            from losslab.runner.rehearsal import RehearsalComponents

            components_factory = partial(RehearsalComponents, data=data)
    components = components_factory(plan_file, backend)  # validates the plan before any write
    rehearsal = getattr(components, "rehearsal", None) if rehearse else None
    if rehearse:
        force = True  # a rehearsal reaches every phase; each check's outcome is still recorded
    if BASE_MODEL in components.schedule.arms:
        raise RunError(
            f"an arm is named {BASE_MODEL!r}, the name of the initial policy's evaluation "
            f"(eval_{BASE_MODEL}.jsonl); rename the arm"
        )
    mirror = open_tracker(tracker)  # a missing tracker package fails before any write

    try:
        if resume is not None:
            run = RunDir.open_for_resume(
                resume, plan_file, backend=backend, force=force, rehearsal=rehearsal
            )
        else:
            run = RunDir.create(
                out or default_run_dir(plan_file, rehearsal=rehearse),
                plan_file,
                backend=backend,
                force=force,
                rehearsal=rehearsal,
            )
            if rehearsal is not None:
                from losslab.runner.rehearsal import rehearsal_marker_text

                (run.root / "REHEARSAL.txt").write_text(rehearsal_marker_text(rehearsal))
    except OSError as e:
        raise RunDirError(f"cannot write the run directory: {e}") from e
    flag = " --rehearse" if rehearse else ""
    resume_hint = f"losslab run {plan_file} --backend {backend}{flag} --resume {run.root}"
    console: RunConsole | None = None
    threads = torch.get_num_threads()  # a resume may pin it to the original run's; restored below
    try:
        force = bool(run.read_manifest().get("force"))
        console = RunConsole(run.log_path, quiet=quiet, total_phases=len(PHASES))
        if mirror is not None:
            mirror.start(run.root.name, _tracker_config(run))
        how = f"resuming {run.root}" if resume is not None else f"run directory {run.root}"
        console.log(f"losslab run {plan_file} --backend {backend}{flag}: {how}")
        if rehearsal is not None:
            console.log(rehearsal["note"])
            console.log(f"rehearsal model: {rehearsal['model']['architecture']}")
            console.log(f"rehearsal tokenizer: {rehearsal['model']['tokenizer']}")
        return _Runner(run, components, console, force, mirror).run()
    except KeyboardInterrupt as e:
        what = interrupt_name(e)
        if console is not None:
            try:
                console.log(f"{what}; the run directory is resumable: {resume_hint}")
            except OSError:  # e.g. the disk is full: the message below still reaches the user
                pass
        raise RunInterrupted(f"{what}. Continue with: {resume_hint}", interrupt_exit_code(e)) from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise RunDirError(
                f"the disk is full while writing {e.filename or run.root}. Free space, then "
                f"continue with: {resume_hint}"
            ) from e
        raise
    except CheckFailed:
        raise
    except RunError as e:
        _log_quietly(console, f"stopped: {e}")
        raise
    except Exception as e:  # a bug: keep the traceback, but leave a trace in run.log too
        _log_quietly(
            console,
            f"crashed: {type(e).__name__}: {e}; the run directory is resumable: {resume_hint}",
        )
        raise
    finally:
        if mirror is not None:
            mirror.close()
        if console is not None:
            console.close()
        run.release()
        torch.set_num_threads(threads)


def _tracker_config(run: RunDir) -> dict[str, Any]:
    """What a tracker run records besides the metrics: identifiers only, never the environment."""
    manifest = run.read_manifest()
    return {
        "run_dir": str(run.root.resolve()),
        "plan_sha256": manifest.get("plan_sha256"),
        "losslab_version": manifest.get("losslab_version"),
        "backend": manifest.get("backend"),
    }


def _log_quietly(console: RunConsole | None, message: str) -> None:
    """Log a last line if the log can still be written (not on a full disk)."""
    if console is None:
        return
    try:
        console.log(message)
    except OSError:
        pass


class _Runner:
    def __init__(
        self,
        run: RunDir,
        comp: Components,
        console: RunConsole,
        force: bool,
        mirror: MetricsMirror | None = None,
    ) -> None:
        self.run_dir, self.comp, self.console, self.force = run, comp, console, force
        self.sched = comp.schedule
        self.mirror = mirror

    # --- the phases, in order ----------------------------------------------------------------
    def run(self) -> RunResult:
        self._write_environment()
        self._check_phase("preflight", self.run_dir.preflight_path, self.comp.preflight)
        self._check_phase("restoration", self.run_dir.restoration_path, self.comp.restoration)
        self._pilot()
        self._check_phase("feasibility", self.run_dir.feasibility_path, self._feasibility)
        self._check_phase("gate", self.run_dir.gate_path, self._gate)
        self._arms()
        self._evaluation()
        verdict = self._decision()
        html = self._report()
        line = self._verdict_line(verdict)
        if self.run_dir.read_manifest().get("rehearsal"):
            line += " (REHEARSAL: toy model, not evidence)"
        self.console.log(line)
        self.console.log(f"report: {html.resolve()}")
        return RunResult(self.run_dir.root, verdict, html)

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
        manifest["schedule"] = {
            "arms": list(self.sched.arms),
            "treatment": self.sched.treatment,
            "steps": self.sched.steps,
            "pilot_steps": self.sched.pilot_steps,
            "seeds": self.sched.seeds,
            "units": {
                u: {"arm": self.sched.plan_arm(u), "seed": self.sched.seeds[u]}
                for u in self.sched.arms
            },
        }
        self.run_dir.write_manifest(manifest)

    def _status(self, phase: str) -> str | None:
        return self.run_dir.read_manifest().get("phases", {}).get(phase, {}).get("status")

    def _check_phase(
        self, name: str, artifact: Path, compute: Callable[[], dict[str, Any]]
    ) -> None:
        """Run a pass/fail phase; stop on failure unless forced. Skipped once recorded done."""
        if self._status(name) in ("done", "forced") and self._intact(artifact):
            self.console.skip_phase(name, "already done (resume)")
            return
        t0 = time.perf_counter()
        with self.console.phase(name):
            result = compute()
            write_json_artifact(artifact, result)
        seconds = time.perf_counter() - t0
        rel = str(artifact.relative_to(self.run_dir.root))
        if result.get("passed", False):
            self.run_dir.mark_phase(name, "done", seconds=seconds, artifact=rel)
            return
        failures = result.get("failures") or [
            {"check": name, "measured": "failed", "bound": "see artifact"}
        ]
        first = failures[0]
        err = CheckFailed(name, str(first["check"]), first["measured"], str(first["bound"]), rel)
        if self.force:
            self.run_dir.mark_phase(
                name, "forced", seconds=seconds, artifact=rel, message=err.summary
            )
            self.console.log(f"WARNING --force continues past: {err.summary}")
            return
        self.run_dir.mark_phase(name, "failed", seconds=seconds, artifact=rel, message=str(err))
        self.console.log(f"stopped: {err}")
        self._report(quiet_fail=True)
        raise err

    def _pilot(self) -> None:
        if self._status("pilot") == "done":
            self.console.skip_phase("pilot", "already done (resume)")
            return
        k = self.sched.pilot_steps
        t0 = time.perf_counter()
        probe: dict[str, Any] = {}

        def time_eval(trainer: ArmTrainer) -> None:
            t = time.perf_counter()
            probe.update(self.comp.eval_probe(trainer))
            probe["eval_probe_seconds"] = time.perf_counter() - t

        with self.console.phase("pilot", f"first {k} steps of {self.sched.treatment}"):
            _, setup_s = self._train(self.sched.treatment, until=k, before_close=time_eval)
        self.run_dir.mark_phase(
            "pilot",
            "done",
            seconds=time.perf_counter() - t0,
            steps=k,
            arm=self.sched.treatment,
            setup_seconds=setup_s,
            **probe,
        )

    def _pilot_rows(self) -> list[dict[str, Any]]:
        return self._metrics_rows(self.sched.treatment)[: self.sched.pilot_steps]

    def _metrics_rows(self, arm: str) -> list[dict[str, Any]]:
        """The arm's metrics.jsonl; a damaged one is rebuilt from its checkpoint (same rows)."""
        path = self.run_dir.metrics_path(arm)
        if not self._intact(path, read_rows):
            ck = self._checkpoint(arm)
            if ck is None:
                raise RunDirError(f"{path} is damaged and arm {arm} has no intact checkpoint")
            atomic_write_jsonl(path, ck.metrics)
            self.console.log(f"rebuilt {path.name} of {arm} from checkpoint {ck.path.name}")
        return read_rows(path)

    def _verify_report_inputs(self) -> None:
        """Before the report reads them: rebuild damaged metrics; a damaged executed-config
        record is set aside (the report then shows it as absent; the log names it). The check
        phases' artifacts were verified, and recomputed if damaged, by `_check_phase`."""
        for arm in self.sched.arms:
            if self.run_dir.metrics_path(arm).exists():
                self._metrics_rows(arm)
        if self.run_dir.executed_config_path.exists():
            self._intact(self.run_dir.executed_config_path)

    # --- artifacts read back -----------------------------------------------------------------
    def _intact(self, path: Path, reader: Callable[[Path], Any] = read_object) -> bool:
        """Whether `path` reads back with its schema; a damaged file is named, set aside as
        `<name>.damaged` and recomputed by the caller."""
        try:
            reader(path)
            return True
        except DamagedArtifact as e:
            if path.exists():
                aside = set_aside(path)
                self.console.log(f"{e}; set aside as {aside.name}")
            return False

    def _checkpoint(self, arm: str) -> Checkpoint | None:
        """The arm's newest intact checkpoint; each newer damaged one is named in the log."""
        ck, damaged = newest_intact_checkpoint(self.run_dir.checkpoints_dir(arm))
        for path, why in damaged:
            self.console.log(f"{arm}: checkpoint {path.name} is damaged ({why}); skipped")
        if damaged:
            fallback = f"checkpoint {ck.path.name}" if ck else "the start (no intact checkpoint)"
            self.console.log(f"{arm}: falling back to the newest intact one: {fallback}")
        return ck

    def _feasibility(self) -> dict[str, Any]:
        pilot = self.run_dir.read_manifest()["phases"]["pilot"]
        rows = self._pilot_rows()
        timings = {
            "rows": rows,
            "pilot_steps": len(rows),
            "step_seconds": [r.get("time/step_s") for r in rows],
            "setup_seconds": pilot.get("setup_seconds"),
            "pilot_seconds": pilot.get("seconds"),
            "eval_s_per_item": pilot.get("eval_s_per_item"),
            "arms": len(self.sched.arms),
            "steps_per_arm": self.sched.steps,
        }
        return self.comp.feasibility(timings)

    def _gate(self) -> dict[str, Any]:
        path = self.run_dir.executed_config_path
        recorded = read_object(path) if path.is_file() and self._intact(path) else {}
        return self.comp.gate(self._pilot_rows(), recorded.get(self.sched.treatment, {}))

    def _arms(self) -> None:
        if self._status("arms") == "done":
            self.console.skip_phase("arms", "already done (resume)")
            return
        t0 = time.perf_counter()
        with self.console.phase("arms", f"{len(self.sched.arms)} arms x {self.sched.steps} steps"):
            for arm in self.sched.arms:
                self._train(arm, until=self.sched.steps)
        self.run_dir.mark_phase("arms", "done", seconds=time.perf_counter() - t0)

    def _evaluation(self) -> None:
        if self._status("evaluation") == "done" and all(
            self._intact(self.run_dir.eval_path(arm), read_rows) for arm in self.sched.arms
        ):
            self.console.skip_phase("evaluation", "already done (resume)")
            return
        t0 = time.perf_counter()
        with self.console.phase("evaluation"):
            base_accuracy = self._evaluate_base()
            for arm in self.sched.arms:
                path = self.run_dir.eval_path(arm)
                if path.is_file() and self._intact(path, read_rows):
                    self.console.log(f"evaluation of {arm}: already done (resume)")
                    continue
                ck = self._checkpoint(arm)
                if ck is None or ck.step != self.sched.steps:  # final one damaged: redo the rest
                    self._train(arm, until=self.sched.steps)
                    ck = self._checkpoint(arm)
                if ck is None or ck.step != self.sched.steps:
                    raise RunError(f"arm {arm} has no final checkpoint to evaluate")
                trainer = self._open_trainer(arm)
                try:
                    trainer.load(ck.trainer_dir, ck.trainer, ck.cursor)
                    seed_everything(self.sched.seeds[arm] + EVAL_SEED_OFFSET)
                    t_arm = time.perf_counter()
                    rows = self.comp.evaluate(arm, trainer)
                    acc = _accuracy(rows)
                    self.console.log(
                        f"evaluation of {arm}: {len(rows)} items, accuracy {acc:.4f} "
                        f"({acc - base_accuracy:+.4f} vs base model), "
                        f"{time.perf_counter() - t_arm:.1f} s"
                    )
                finally:
                    trainer.close()
                atomic_write_jsonl(path, rows)
        self.run_dir.mark_phase("evaluation", "done", seconds=time.perf_counter() - t0)

    def _evaluate_base(self) -> float:
        """Evaluate the initial policy once (a fresh trainer of the first arm, untrained; every
        arm starts from these weights, as the restoration preflight checks); its accuracy."""
        path = self.run_dir.base_eval_path
        if path.is_file() and self._intact(path, read_rows):
            self.console.log("evaluation of the base model: already done (resume)")
            return _accuracy(read_rows(path))
        arm = self.sched.arms[0]
        seed_everything(self.sched.seeds[arm])  # the same initial state the arm trains from
        t0 = time.perf_counter()
        trainer = self.comp.make_trainer(arm)
        try:
            seed_everything(self.sched.seeds[arm] + EVAL_SEED_OFFSET)
            rows = self.comp.evaluate(arm, trainer)
        finally:
            trainer.close()
        atomic_write_jsonl(path, rows)
        acc = _accuracy(rows)
        self.console.log(
            f"evaluation of the base model (initial policy): {len(rows)} items, accuracy "
            f"{acc:.4f}, {time.perf_counter() - t0:.1f} s"
        )
        return acc

    def _decision(self) -> dict[str, Any]:
        if self._status("decision") == "done" and self._intact(self.run_dir.verdict_path):
            self.console.skip_phase("decision", "already done (resume)")
            return read_object(self.run_dir.verdict_path)
        t0 = time.perf_counter()
        with self.console.phase("decision"):
            evals = {arm: read_rows(self.run_dir.eval_path(arm)) for arm in self.sched.arms}
            verdict = self.comp.decide(evals)
            write_json_artifact(self.run_dir.verdict_path, verdict)
        self.run_dir.mark_phase("decision", "done", seconds=time.perf_counter() - t0)
        return verdict

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
            self._verify_report_inputs()
            paths = build_report(self.run_dir.root)
        self.run_dir.mark_phase("report", "done", seconds=time.perf_counter() - t0)
        return paths.html_path

    @staticmethod
    def _verdict_line(verdict: dict[str, Any]) -> str:
        # the verdict record of losslab.stats (Verdict.to_dict): "verdict" word and "ci" bounds
        ci = verdict.get("ci")
        ci_text = f" (CI [{ci[0]:+.4f}, {ci[1]:+.4f}])" if ci else ""
        return f"verdict: {verdict.get('verdict')}{ci_text}"

    # --- training with per-step checkpoints --------------------------------------------------
    def _open_trainer(self, arm: str) -> ArmTrainer:
        """Seed, create the arm's trainer, and record + check its executed configuration."""
        seed_everything(self.sched.seeds[arm])
        trainer = self.comp.make_trainer(arm)
        path = self.run_dir.executed_config_path
        recorded = read_object(path) if path.is_file() and self._intact(path) else {}
        if arm not in recorded:
            values = self.comp.executed_config(arm, trainer)
            for v in values.values():
                v["match"] = v.get("plan") == v.get("executed")
            recorded[arm] = values
            write_json_artifact(path, recorded)
            bad = [(k, v) for k, v in values.items() if not v["match"]]
            if bad:
                key, v = bad[0]
                err = CheckFailed(
                    "executed config",
                    f"{arm}.{key}",
                    v.get("executed"),
                    f"== {v.get('plan')!r} (the plan)",
                    path.name,
                )
                if not self.force:
                    trainer.close()
                    self.run_dir.mark_phase("executed_config", "failed", message=str(err))
                    self.console.log(f"stopped: {err}")
                    self._report(quiet_fail=True)
                    raise err
                self.run_dir.mark_phase("executed_config", "forced", message=err.summary)
                self.console.log(f"WARNING --force continues past: {err.summary}")
        return trainer

    def _train(
        self,
        arm: str,
        until: int,
        before_close: Callable[[ArmTrainer], None] | None = None,
    ) -> tuple[list[dict[str, Any]], float]:
        """Train `arm` up to `until` completed steps, checkpointing after every step.

        `before_close(trainer)` runs on the trained state before the trainer is released (the
        pilot times a few evaluation items there); it runs after the last checkpoint, so it
        cannot change what a resumed run computes.
        """
        ckdir = self.run_dir.checkpoints_dir(arm)
        ck = self._checkpoint(arm)
        start = ck.step if ck else 0
        if ck is not None:  # the checkpoint is the truth; a kill may have come before this write
            atomic_write_jsonl(self.run_dir.metrics_path(arm), ck.metrics)
        if start >= until and before_close is None:
            self.console.log(f"{arm}: {start} steps already done (resume)")
            return (ck.metrics if ck else []), 0.0
        t_setup = time.perf_counter()
        trainer = self._open_trainer(arm)
        rows: list[dict[str, Any]] = []
        if ck is not None:
            trainer.load(ck.trainer_dir, ck.trainer, ck.cursor)
            restore_rng(ck.rng)
            rows = list(ck.metrics)
            self.console.log(f"{arm}: continuing from checkpoint step {ck.step}")
        setup_s = time.perf_counter() - t_setup
        try:
            with self.console.steps(arm, start, until) as bar:
                # the engine's one arm loop; after each step: checkpoint, then metrics.jsonl
                for row in train_steps(trainer, start, until, arm=arm):
                    i = row["step"]
                    rows.append(row)
                    save_checkpoint(
                        ckdir, i + 1, cursor=trainer.cursor, metrics=rows, save_trainer=trainer.save
                    )
                    atomic_write_jsonl(self.run_dir.metrics_path(arm), rows)
                    if self.mirror is not None:
                        self.mirror.log(arm, row)
                    prune_checkpoints(ckdir, KEEP_CHECKPOINTS, protect={self.sched.steps})
                    bar.done(i, row["time/step_s"], _step_summary(row))
            if before_close is not None:
                before_close(trainer)
        finally:
            trainer.close()
        return rows, setup_s


def _accuracy(rows: list[dict[str, Any]]) -> float:
    return sum(bool(r.get("correct")) for r in rows) / max(len(rows), 1)


def _step_summary(row: dict[str, Any]) -> str:
    keys = ("reward/mean", "loss/clip_fraction", "policy/drift_vs_sampler_q90")
    return " ".join(f"{k}={row[k]:.4g}" for k in keys if isinstance(row.get(k), int | float))

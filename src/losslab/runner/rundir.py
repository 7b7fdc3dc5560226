"""The run directory: one folder per `losslab run`, one artifact per phase, all written atomically.

Layout (every path is relative to the run directory):

    manifest.json                 plan sha256, losslab version, backend, phase status, and the
                                  ledger of artifacts as written (sha256, size, rows)
    plan.json                     byte-for-byte copy of the plan that was run
    preflight.json                correctness preflight (losses vs pinned references)
    restoration.json              restoration preflight (both arms start from the same state)
    pilot/gate.json               activation gate: measured pilot metrics vs the plan's bounds
    pilot/diagnostics.json        pilot diagnostics: sampler/trainer gap and alignment, mismatch
                                  vs drift, effective group size, seeds (`runner.phases.pilot`)
    feasibility.json              projected cost of the full run from measured pilot timings
    executed_config.json          the configuration the backend actually ran, compared with the plan
    arms/<arm>/metrics.jsonl      one row per RL step
    arms/<arm>/checkpoints/step_NNNN/   state after step NNNN (weights, optimizer, RNG, cursor)
    eval_<arm>.jsonl              one row per evaluation item (question, reference answer,
                                  completion, extracted answer, grade)
    eval_base_model.jsonl         the same items on the initial policy (shared by every arm)
    verdict.json                  decision rule applied to the paired evaluation
    report.json, report.html      the report (`losslab report RUN_DIR` rebuilds both)
    run.log                       what the run printed, plus timings
    REHEARSAL.txt                 only in a `--rehearse` run's directory: what it is and is not
    .lock                         flock of the process running in this directory (its pid inside)

Every path written or deleted under a run directory goes through `RunDir.under` (`confined`):
resolved with symlinks followed and `..` applied, it must stay inside the run directory, else the
run is refused (`PathOutsideRunDir`, exit 2, naming the path) before anything is written. An arm
name such as `../../victim/train` or a `checkpoints/` folder symlinked elsewhere is therefore
never written through; run.log and `.lock` are opened without following a link.

A file only appears once it is complete (`losslab.atomic`: temp file + `os.replace`), so a run
killed at any point leaves a directory that `--resume` can continue from. The directory itself is
built as a hidden sibling and renamed into place, so it never exists half-made.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from losslab import __version__
from losslab.artifacts import LEDGER_KEY, find_symlink, ledger_entry, ledger_problem
from losslab.atomic import atomic_dir, atomic_write_bytes, atomic_write_text
from losslab.runner.errors import DiskFull, ResumeRefused, RunDirError
from losslab.runner.lock import LOCK_NAME, RunDirLock, acquire, open_regular

MANIFEST_FORMAT = 1
BASE_MODEL = "base_model"
"""Name of the initial policy's evaluation (eval_base_model.jsonl), reserved among arm names."""


class PathOutsideRunDir(RunDirError):
    """A path to write or delete that resolves outside its run directory (a plan string used as
    a path, an absolute path, a symlinked subfolder): refused, nothing is written there."""


def confined(root: Path, path: Path) -> Path:
    """`path`, refused unless it resolves (symlinks followed, `..` applied) inside `root`.

    Why resolve rather than inspect the string: a name without `..` still escapes through a
    symlinked folder, and a name with `..` may still land inside; only the resolved path says.

    Raises:
        PathOutsideRunDir: naming `path`, where it resolves to, and the run directory.
    """
    base = Path(os.path.realpath(root))
    full = Path(os.path.realpath(path))
    if full != base and base not in full.parents:
        raise PathOutsideRunDir(
            f"refusing to write {path}: it resolves to {full}, outside the run directory "
            f"{base} (a name with '/' or '..', an absolute path, or a symlinked folder); "
            "nothing was written there"
        )
    return Path(path)


def open_log_nofollow(path: Path) -> int:
    """A file descriptor appending to `path` (created if absent), refusing a symlink or a
    non-regular file there, so a planted link never makes the run append into its target."""
    return open_regular(
        path,
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        on_link=PathOutsideRunDir(
            f"refusing to write {path}: it is a symbolic link; remove it, then resume"
        ),
        on_other=PathOutsideRunDir(f"refusing to write {path}: it is not a regular file"),
    )


def eval_file(arm: str) -> str:
    """The run-directory name of an arm's per-item evaluation."""
    return f"eval_{arm}.jsonl"


def dumps_json(obj: Any) -> str:
    """Canonical JSON for artifacts: sorted keys, two-space indent, NaN written as null (the text
    is never redacted: see `redact`)."""
    return json.dumps(_json_safe(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


SECRET_ENV_VARS = ("TINKER_API_KEY", "WANDB_API_KEY", "HF_TOKEN")
REDACT_MIN_CHARS = 16
"""Shortest secret value that is redacted. A shorter one ("a") would match ordinary text, and
replacing it would garble the log; `runner.startup` refuses such a TINKER_API_KEY when the run
uses it. Real keys (Tinker's, W&B's 40 hex digits, HF's `hf_...`) are far longer."""


def redactable_secrets() -> dict[str, str]:
    """Name -> value of each secret environment variable set to at least `REDACT_MIN_CHARS`."""
    out = {}
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if len(value) >= REDACT_MIN_CHARS:
            out[name] = value
    return out


def redact(text: str) -> str:
    """Replace the values of secret environment variables (TINKER_API_KEY) by `***`.

    For text streams only (run.log, the console, crash files): artifacts are never rewritten
    (a replaced character inside a sha256 or a backend name would corrupt them); an artifact
    that would hold a secret is refused instead (`refuse_secret_in_artifact`)."""
    for value in redactable_secrets().values():
        text = text.replace(value, "***")
    return text


class SecretInArtifact(RunDirError):
    """An artifact would contain a secret's value: it is not written (exit 2)."""


def refuse_secret_in_artifact(text: str, path: Path) -> None:
    """Refuse to write `text` to `path` when it holds a secret's value (as is, or JSON-escaped),
    naming the variable, never the value."""
    for name, value in redactable_secrets().items():
        if value in text or json.dumps(value)[1:-1] in text:
            raise SecretInArtifact(
                f"refusing to write {path}: it would contain the value of {name}; losslab keeps "
                "secrets out of run directories (something in the plan, data or a component "
                "carries the key)"
            )


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "model_dump"):
        return _json_safe(obj.model_dump(mode="json"))
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _json_safe(obj.item())
    return obj


def write_json_artifact(path: Path, obj: Any) -> None:
    """Write `obj` as canonical artifact JSON (`dumps_json`: redacted, NaN as null) atomically.

    Run-directory artifacts only; plain JSON files use `losslab.atomic.atomic_write_json`."""
    text = dumps_json(obj)
    refuse_secret_in_artifact(text, path)
    atomic_write_text(path, text)


def atomic_write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """The metrics.jsonl / eval writer: one canonical JSON object per line, replaced atomically."""
    text = "".join(json.dumps(_json_safe(r), sort_keys=True, allow_nan=False) + "\n" for r in rows)
    refuse_secret_in_artifact(text, path)
    atomic_write_text(path, text)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _remove_stale_creations(root: Path) -> None:
    """Delete hidden half-built copies of `root` left by a creator that was killed (SIGKILL);
    one whose lock is still held belongs to a live creator and stays."""
    if not root.parent.is_dir():
        return
    for leftover in root.parent.glob(f".{root.name}.creating-*"):
        try:
            acquire(leftover).release()
        except (RunDirError, OSError):  # held, or its .lock is a link: left alone
            continue
        shutil.rmtree(leftover, ignore_errors=True)


def refuse_secrets(plan_bytes: bytes, plan_file: Path) -> None:
    """Refuse to copy a plan that holds the value of a secret (TINKER_API_KEY) into plan.json."""
    from losslab.plan.semantics import secret_problems

    problems = secret_problems(plan_bytes.decode("utf-8", errors="replace"))
    if problems:
        raise RunDirError(f"{plan_file}: {problems[0][1]}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_run_dir(plan_file: Path, rehearsal: bool = False) -> Path:
    """runs/<plan name>[-REHEARSAL]-<UTC time>."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    kind = "-REHEARSAL" if rehearsal else ""
    return Path("runs") / f"{Path(plan_file).stem}{kind}-{stamp}"


def rehearsal_marker_text(record: dict[str, Any]) -> str:
    """REHEARSAL.txt at the run directory's root: what this directory is and is not."""
    model = record["model"]
    return (
        f"{record['note']}.\n\n"
        f"plan base model: {record['plan_base_model']}\n"
        f"rehearsal model: {model['architecture']}; {model['num_hidden_layers']} layers "
        f"{model['layer_types']}, hidden {model['hidden_size']}, {model['params']:.0f} "
        f"parameters, {model['weights']}\n"
        f"tokenizer: {model['tokenizer']}\n"
        f"scale: {record['scale']}\n"
        "This directory cannot be resumed as a real run.\n"
    )


def open_run_dir(
    plan_file: Path,
    *,
    out: Path | None,
    resume: Path | None,
    backend: str,
    force: bool,
    rehearsal: dict[str, Any] | None,
    units: Iterable[str] = (),
    loss_code: dict[str, Any] | None = None,
) -> RunDir:
    """The locked run directory of a `losslab run`: `resume` reopened (same plan, backend and
    version, and the same bytes of every loss file in `loss_code`), else a fresh one at `out`
    (default `default_run_dir`). `loss_code` is `{arm: code provenance}` of the arms whose loss is
    code (`conformance.user_loss.UserLossFn.code`), kept in manifest.json.

    `units` (the schedule's arm names) are checked first (`check_unit_paths`): a name whose
    files would land outside the directory is refused before the directory is even made."""
    how = dict(backend=backend, force=force, rehearsal=rehearsal, loss_code=loss_code)
    root = resume or out or default_run_dir(plan_file, rehearsal=rehearsal is not None)
    check_unit_paths(root, units)
    try:
        if resume is not None:
            run = RunDir.open_for_resume(resume, plan_file, **how)
        else:
            run = RunDir.create(root, plan_file, **how)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull(
                f"no space left on the device while creating the run directory "
                f"({e.filename or out or resume}); nothing was run"
            ) from e
        raise RunDirError(f"cannot write the run directory: {e}") from e
    run.remember(run.read_manifest())
    return run


def check_unit_paths(root: Path, units: Iterable[str]) -> None:
    """Refuse (`PathOutsideRunDir`) any arm name whose folder or evaluation file would resolve
    outside `root`; the same check runs again at every write (`RunDir.under`)."""
    run = RunDir(Path(root))
    for unit in units:
        try:
            run.arm_dir(unit)
            run.eval_path(unit)
        except PathOutsideRunDir as e:
            raise PathOutsideRunDir(f"arm {unit!r}: {e}") from None


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RunDir:
    """Paths and manifest bookkeeping of one run directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.lock: RunDirLock | None = None  # held from create/open_for_resume until release()
        self.force = False  # `--force` of this run or of any run of it before (the manifest's)
        self.identity: dict[str, Any] = {}  # identifiers for a tracker; never the environment

    def remember(self, manifest: dict[str, Any]) -> None:
        """Keep what the run reads of its manifest once: `force` and `identity`."""
        self.force = bool(manifest.get("force"))
        self.identity = {
            "run_dir": str(self.root.resolve()),
            **{k: manifest.get(k) for k in ("plan_sha256", "losslab_version", "backend")},
        }

    def release(self) -> None:
        """Free the run directory for another `losslab run` (process exit frees it too)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # --- paths -------------------------------------------------------------------------------
    def under(self, *parts: str) -> Path:
        """`root/<parts>`, confined to the run directory (`confined`): every artifact path the
        runner writes or deletes is built here, at the moment it is used."""
        return confined(self.root, self.root.joinpath(*parts))

    @property
    def manifest_path(self) -> Path:
        return self.under("manifest.json")

    @property
    def plan_path(self) -> Path:
        return self.under("plan.json")

    @property
    def executed_config_path(self) -> Path:
        return self.under("executed_config.json")

    @property
    def report_html_path(self) -> Path:
        return self.under("report.html")

    @property
    def log_path(self) -> Path:
        return self.under("run.log")

    def arm_dir(self, arm: str) -> Path:
        return self.under("arms", arm)

    def metrics_path(self, arm: str) -> Path:
        return self.under("arms", arm, "metrics.jsonl")

    def checkpoints_dir(self, arm: str) -> Path:
        return self.under("arms", arm, "checkpoints")

    def eval_path(self, arm: str) -> Path:
        return self.under(eval_file(arm))

    @property
    def base_eval_path(self) -> Path:
        """The initial policy's evaluation; an arm may therefore not be named `base_model`."""
        return self.eval_path(BASE_MODEL)

    # --- manifest ----------------------------------------------------------------------------
    def read_manifest(self) -> dict[str, Any]:
        try:
            manifest = read_json(self.manifest_path)
        except FileNotFoundError as e:
            raise RunDirError(
                f"{self.root} is not a losslab run directory: manifest.json is missing"
            ) from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunDirError(f"{self.manifest_path} is damaged: not valid JSON ({e})") from e
        if not isinstance(manifest, dict) or not isinstance(manifest.get("phases", {}), dict):
            raise RunDirError(
                f"{self.manifest_path} is damaged: expected an object with a 'phases' object"
            )
        phases = manifest.get("phases", {})
        bad = [k for k, v in phases.items() if not isinstance(v, dict)]
        if bad:
            raise RunDirError(f"{self.manifest_path} is damaged: phases.{bad[0]} is not an object")
        return manifest

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        manifest["updated_at"] = _now()
        write_json_artifact(self.manifest_path, manifest)

    def record_artifact(self, path: Path) -> None:
        """Enter the just-written artifact `path` in the manifest's ledger (`artifacts.LEDGER_KEY`:
        sha256, size, rows), so a later cut or edit is detected on resume and by the report."""
        manifest = self.read_manifest()
        rel = Path(path).relative_to(self.root).as_posix()
        manifest.setdefault(LEDGER_KEY, {})[rel] = ledger_entry(path)
        self.write_manifest(manifest)

    def forget_artifact(self, path: Path) -> None:
        """Drop `path` from the ledger (it was set aside as damaged; recomputing re-enters it)."""
        manifest = self.read_manifest()
        if manifest.get(LEDGER_KEY, {}).pop(Path(path).relative_to(self.root).as_posix(), None):
            self.write_manifest(manifest)

    def ledger_problem(self, path: Path) -> str | None:
        """Why `path` no longer matches what the ledger recorded when it was written, or None
        (also None for a file the ledger does not know: written by an older losslab)."""
        entry = (
            self.read_manifest()
            .get(LEDGER_KEY, {})
            .get(Path(path).relative_to(self.root).as_posix())
        )
        return None if entry is None else ledger_problem(path, entry)

    def mark_phase(self, phase: str, status: str, **info: Any) -> None:
        """Record a phase's status ("done", "failed", "forced") and facts such as its seconds."""
        manifest = self.read_manifest()
        manifest.setdefault("phases", {})[phase] = {"status": status, "at": _now(), **info}
        self.write_manifest(manifest)

    # --- create / open -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        root: Path,
        plan_file: Path,
        *,
        backend: str,
        force: bool,
        rehearsal: dict[str, Any] | None = None,
        loss_code: dict[str, Any] | None = None,
    ) -> RunDir:
        """Make a fresh run directory holding a copy of the plan and a manifest (`rehearsal`:
        the record of a `--rehearse` run, which marks the directory as one)."""
        root = Path(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            half = root.is_dir() and not (root / "manifest.json").exists()
            raise RunDirError(
                f"--out {root} already exists and is not empty"
                + ("; it has no manifest.json (a run killed while creating it?)" if half else "")
                + f"; pass a new folder, or `--resume {root}` to continue a run there"
            )
        plan_bytes = Path(plan_file).read_bytes()
        refuse_secrets(plan_bytes, plan_file)
        if root.is_dir():
            root.rmdir()  # empty: replaced whole by the complete folder below
        _remove_stale_creations(root)
        # built in a hidden sibling and renamed into place: a kill leaves no half-made run dir.
        # The lock is taken inside, so it is held from the first moment `root` exists.
        try:
            with atomic_dir(root, prefix=f".{root.name}.creating-", overwrite=False) as tmp:
                lock = acquire(tmp)
                try:
                    cls(tmp)._write_new(
                        plan_bytes,
                        plan_file,
                        backend=backend,
                        force=force,
                        rehearsal=rehearsal,
                        loss_code=loss_code,
                    )
                except BaseException:
                    lock.release()
                    raise
        except FileExistsError as e:
            raise RunDirError(f"--out {root} was created by another process meanwhile") from e
        run = cls(root)
        lock.root = root
        run.lock = lock
        return run

    def _write_new(
        self,
        plan_bytes: bytes,
        plan_file: Path,
        *,
        backend: str,
        force: bool,
        rehearsal: dict[str, Any] | None = None,
        loss_code: dict[str, Any] | None = None,
    ) -> None:
        atomic_write_bytes(self.plan_path, plan_bytes)
        manifest = {
            "format": MANIFEST_FORMAT,
            "losslab_version": __version__,
            "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
            "plan_source": str(Path(plan_file).resolve()),
            "backend": backend,
            "force": force,
            "created_at": _now(),
            "resumed": [],
            "phases": {},
            LEDGER_KEY: {"plan.json": ledger_entry(self.plan_path)},
        }
        if loss_code:
            manifest["loss_code"] = loss_code
        if rehearsal is not None:
            manifest["rehearsal"] = rehearsal
            atomic_write_text(self.under("REHEARSAL.txt"), rehearsal_marker_text(rehearsal))
        self.write_manifest(manifest)

    @classmethod
    def open_for_resume(
        cls,
        root: Path,
        plan_file: Path,
        *,
        backend: str,
        force: bool,
        rehearsal: dict[str, Any] | None = None,
        loss_code: dict[str, Any] | None = None,
    ) -> RunDir:
        """Open an existing run directory, refusing one made by another plan or losslab version,
        a rehearsal's directory for a real run (or a real run's for a rehearsal), and one whose
        loss code has changed since (`loss_code`)."""
        root = Path(root)
        if not root.is_dir():
            raise ResumeRefused(f"--resume {root}: no such directory")
        run = cls(root)
        run.lock = acquire(root)
        try:
            link = find_symlink(root)
            if link is not None:
                raise PathOutsideRunDir(
                    f"--resume {root}: {link} is a symbolic link; losslab writes none, so it "
                    "points at something that is not this run's. Remove it (losslab recomputes "
                    "what is missing), then resume"
                )
            return run._open_locked(
                plan_file, backend=backend, force=force, rehearsal=rehearsal, loss_code=loss_code
            )
        except BaseException:
            run.release()
            raise

    def _open_locked(
        self,
        plan_file: Path,
        *,
        backend: str,
        force: bool,
        rehearsal: dict[str, Any] | None,
        loss_code: dict[str, Any] | None = None,
    ) -> RunDir:
        run, root = self, self.root
        if not run.manifest_path.exists() and run.plan_path.is_file():
            run._complete_half_made(plan_file, backend=backend, force=force, rehearsal=rehearsal)
        manifest = run.read_manifest()
        if manifest.get("rehearsal") and rehearsal is None:
            raise ResumeRefused(
                f"--resume {root}: that directory holds a REHEARSAL (a toy model at toy scale); "
                "it can never become a real run. Start the real run in a new directory"
            )
        if rehearsal is not None and not manifest.get("rehearsal"):
            raise ResumeRefused(
                f"--resume {root}: that directory holds a real run; --rehearse cannot continue it"
            )
        plan_sha = sha256_file(plan_file)
        if manifest.get("plan_sha256") != plan_sha:
            raise ResumeRefused(
                f"--resume {root}: the run directory was made from another plan "
                f"(plan sha256 {manifest.get('plan_sha256')}, {plan_file} has {plan_sha})"
            )
        if manifest.get("losslab_version") != __version__:
            raise ResumeRefused(
                f"--resume {root}: the run directory was made by losslab "
                f"{manifest.get('losslab_version')}, this is losslab {__version__}; "
                "results would mix two versions"
            )
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ResumeRefused(
                f"--resume {root}: manifest format {manifest.get('format')} is not "
                f"{MANIFEST_FORMAT}"
            )
        if manifest.get("backend") != backend:
            raise ResumeRefused(
                f"--resume {root}: the run used --backend {manifest.get('backend')}, "
                f"not {backend}; the arms must run on one backend"
            )
        refuse_changed_loss_code(root, manifest.get("loss_code") or {}, loss_code)
        plan_bytes = Path(plan_file).read_bytes()
        if not run.plan_path.is_file() or run.plan_path.read_bytes() != plan_bytes:
            # plan.json was cut or edited; the plan given has the recorded sha256: restore it
            atomic_write_bytes(run.plan_path, plan_bytes)
        manifest.setdefault(LEDGER_KEY, {})["plan.json"] = ledger_entry(run.plan_path)
        manifest.setdefault("resumed", []).append(_now())
        manifest["force"] = bool(manifest.get("force")) or force
        run.write_manifest(manifest)
        return run

    def _complete_half_made(
        self, plan_file: Path, *, backend: str, force: bool, rehearsal: dict[str, Any] | None
    ) -> None:
        """A folder with plan.json but no manifest.json (killed while being created by a losslab
        that did not yet create run directories atomically): completed when it holds only the
        plan copy of this very plan, else refused with what it holds."""
        others = sorted(
            p.name for p in self.root.iterdir() if p.name not in ("plan.json", LOCK_NAME, "run.log")
        )
        plan_bytes = Path(plan_file).read_bytes()
        if others or self.plan_path.read_bytes() != plan_bytes:
            why = (
                f"it also holds {', '.join(others)}" if others else "its plan.json is another plan"
            )
            raise RunDirError(
                f"--resume {self.root}: manifest.json is missing and {why}; it is not a run "
                "directory losslab can continue (start a new run with --out)"
            )
        refuse_secrets(plan_bytes, plan_file)
        self._write_new(plan_bytes, plan_file, backend=backend, force=force, rehearsal=rehearsal)


def refuse_changed_loss_code(
    root: Path, recorded: dict[str, Any], current: dict[str, Any] | None
) -> None:
    """ResumeRefused when an arm's loss code is not the code the run started with (its file's
    sha256 differs, or the arm's loss was or is no longer code): the arms would train two
    losses under one name."""
    current = current or {}
    for arm in sorted(set(recorded) | set(current)):
        was, now = recorded.get(arm) or {}, current.get(arm) or {}
        if was.get("sha256") != now.get("sha256"):
            where = now.get("file") or was.get("file") or now.get("spec") or was.get("spec")
            raise ResumeRefused(
                f"--resume {root}: arm {arm!r}'s loss code {where} changed since the run started "
                f"(sha256 {was.get('sha256')} then, {now.get('sha256')} now); restore the file "
                "or start a new run"
            )

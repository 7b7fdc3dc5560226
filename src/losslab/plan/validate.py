"""Plan validation: every problem at once, each as one `json.path: what is wrong` line.

Two passes over the same file. The pydantic models (`schema.py`) check types and required fields;
`_Checker` then checks the relations between fields on the raw JSON, skipping any value whose type
the first pass already rejected, so one bad field gives one line, and every other problem is still
reported. Nothing here raises a traceback at the user: `load_plan` raises `PlanError`, whose message
is the list of lines.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from losslab.backends.registry import BACKENDS
from losslab.losses.declarations import LOSSES
from losslab.plan import semantics
from losslab.plan.jsonvalues import format_number as _fmt_num
from losslab.plan.jsonvalues import json_dict as _dict
from losslab.plan.jsonvalues import json_int as _int
from losslab.plan.jsonvalues import json_list as _list
from losslab.plan.jsonvalues import json_number as _num
from losslab.plan.loss_names import (
    LossNameError,
    ResolvedLoss,
    RevisionError,
    parse_revision,
    pinned_clip,
    resolve_loss,
)
from losslab.plan.names import name_problem, task_name_problem
from losslab.plan.rule import weighted_range
from losslab.plan.schema import (
    ADAM_DEFAULTS,
    ARM_ROLES,
    EVAL_METRICS,
    GATE_METRICS,
    IMPLEMENTED_FEATURES,
    NOT_IMPLEMENTED_FEATURES,
    EngineSettings,
    ExperimentFeatures,
    GateMetric,
    Plan,
)

ARM_SWITCHABLE = ("loss", "seed", "lr", "updates_per_batch")
"""Arm fields a plan may declare as its `switch`."""


@dataclass(frozen=True)
class Problem:
    """One validation finding: the JSON path of the offending value and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PlanError(ValueError):
    """The plan is malformed; `problems` lists every error, each with its JSON path."""

    def __init__(self, problems: Sequence[Problem], source: str | Path | None = None) -> None:
        self.problems = list(problems)
        self.source = str(source) if source is not None else None
        where = f"{self.source}: " if self.source else ""
        count = len(self.problems)
        head = f"{where}plan has {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


@dataclass
class PlanCheck:
    """Result of checking a plan: the parsed plan (None when there are errors), errors, warnings."""

    plan: Plan | None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    unreadable: bool = False
    """The file could not be read as a plan at all (missing, not a regular file, too large):
    a usage error (`plan check` exits 2), not a problem in a plan."""

    @property
    def ok(self) -> bool:
        return not self.errors


# --- public entry points ---


def check_plan_file(path: str | Path) -> PlanCheck:
    """Read and check a plan file; unreadable files and JSON syntax errors become problems too
    (`PlanCheck.unreadable` marks a file that could not be read at all)."""
    path = Path(path)
    text, unreadable = read_plan_text(path)
    if unreadable is not None:
        return PlanCheck(None, [unreadable], unreadable=True)
    assert text is not None
    return check_plan_text(text, base_dir=path.resolve().parent)


def check_plan_text(text: str, base_dir: str | Path | None = None) -> PlanCheck:
    """Check a plan's JSON text: size and depth first, then the parse (duplicate keys refused
    at their paths), then `check_plan_data` (`base_dir`: the folder a loss file's path is
    relative to)."""
    refused = semantics.text_problems(text)  # size, depth: before the parser runs
    if refused:
        return PlanCheck(None, [Problem(path, msg) for path, msg in refused])
    duplicates: list[Problem] = []
    try:
        data = parse_json(text, duplicates)
    except json.JSONDecodeError as exc:
        secrets = semantics.secret_problems(text)  # no JSON paths to name: the whole text
        return PlanCheck(
            None,
            [
                *(Problem(p, m) for p, m in secrets),
                Problem("$", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"),
            ],
        )
    except (RecursionError, ValueError) as exc:  # depth is bounded above; belt and braces
        return PlanCheck(None, [Problem("$", f"not valid JSON: {exc}")])
    result = check_plan_data(data, base_dir=base_dir)
    if not duplicates:
        return result
    paths = {d.path for d in duplicates}
    rest = [e for e in result.errors if e.path not in paths]
    return PlanCheck(None, [*duplicates, *rest], result.warnings)


def read_plan_text(path: Path) -> tuple[str | None, Problem | None]:
    """The text of a plan file, or the problem that kept it from being read.

    Only a regular file is read, and at most `MAX_PLAN_BYTES` + 1 bytes of it: `/dev/zero`
    would otherwise be read until memory runs out, and a FIFO would block forever (it is
    opened non-blocking, then refused by `fstat`). A symlink to a regular file is followed.
    """
    where = f"plan file {str(path)!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, Problem("$", f"{where} does not exist")
    except OSError as exc:
        return None, Problem("$", f"cannot read {where}: {exc.strerror or exc}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, Problem("$", f"{where} is {_file_kind(info.st_mode)}, not a regular file")
        if info.st_size > semantics.MAX_PLAN_BYTES:
            return None, Problem(
                "$",
                f"{where} is {info.st_size} bytes; at most {semantics.MAX_PLAN_BYTES} are read",
            )
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(semantics.MAX_PLAN_BYTES + 1)  # the file may grow after fstat
    except OSError as exc:
        return None, Problem("$", f"cannot read {where}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    if len(raw) > semantics.MAX_PLAN_BYTES:
        return None, Problem("$", f"{where} is over {semantics.MAX_PLAN_BYTES} bytes")
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, Problem(
            "$", f"{where} is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})"
        )


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "a special file"


def parse_json(text: str, duplicates: list[Problem]) -> Any:
    """`json.loads(text)`, appending a problem to `duplicates` for each key that repeats in one
    object, at the repeated key's JSON path: Python's parser keeps the last value silently, so
    the plan would run with a value its author may not have meant."""
    repeats: dict[int, list[str]] = {}  # id(object) -> its repeated keys; objects stay alive

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in items:
            if key in obj:
                repeats.setdefault(id(obj), []).append(key)
            obj[key] = value
        return obj

    data = json.loads(text, object_pairs_hook=pairs)
    if repeats:
        stack: list[tuple[Any, str]] = [(data, "$")]
        while stack:
            node, where = stack.pop()
            if isinstance(node, dict):
                for key in dict.fromkeys(repeats.get(id(node), [])):
                    sub = f"{where}.{key}" if where != "$" else key
                    duplicates.append(
                        Problem(
                            semantics.shown_path(sub),
                            "this key appears more than once in its object; JSON keeps only the "
                            "last value, so the others would be silently dropped: keep one",
                        )
                    )
                stack.extend(
                    (child, f"{where}.{k}" if where != "$" else str(k)) for k, child in node.items()
                )
            elif isinstance(node, list):
                stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node))
        duplicates.sort(key=lambda p: p.path)
    return data


def check_plan_data(data: Any, base_dir: str | Path | None = None) -> PlanCheck:
    """Check an already-parsed plan (a dict as `json.load` gives it); `base_dir` is the folder a
    loss file's path is relative to (the plan file's; default the current directory)."""
    if not isinstance(data, dict):
        return PlanCheck(None, [Problem("$", f"expected a JSON object, got {type(data).__name__}")])
    if semantics.data_depth(data) > semantics.MAX_DEPTH:
        return PlanCheck(
            None, [Problem("$", f"nesting is deeper than {semantics.MAX_DEPTH} levels")]
        )
    # invalid Unicode, control bytes, secrets: first and alone, since later messages quote strings
    refused = semantics.string_problems(data)
    if refused:
        return PlanCheck(None, [Problem(path, message) for path, message in refused])
    errors: list[Problem] = []
    plan: Plan | None = None
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        errors.extend(_pydantic_problems(exc))
    checker = _Checker(data, base_dir)
    checker.run()
    errors.extend(p for p in checker.errors if p not in errors)
    # meaning of the values (semantics.py): one line per path, the first pass's wins
    sem_errors, sem_warnings = semantics.semantic_problems(data)
    sem_errors += semantics.loss_problems(checker.resolved)
    flagged = {p.path: i for i, p in enumerate(errors)}
    for path, message in sem_errors:
        if path not in flagged:
            flagged[path] = len(errors)
            errors.append(Problem(path, message))
        elif semantics.NOT_FINITE in message:  # the plainest reason wins for NaN/Infinity
            errors[flagged[path]] = Problem(path, message)
    checker.warnings.extend(Problem(path, message) for path, message in sem_warnings)
    if errors:
        unknown = [
            Problem(key, "unknown field; kept as written, not used by this losslab version")
            for key in data
            if key not in Plan.model_fields
        ]
        return PlanCheck(None, errors, [*unknown, *checker.warnings])
    assert plan is not None  # no error means pydantic accepted the data
    warnings = [*_unknown_field_warnings(plan, "$"), *checker.warnings]
    plan._warnings = [str(w) for w in warnings]
    plan._losses = {a.name: checker.losses[a.name] for a in plan.arms if a.name in checker.losses}
    plan._base_dir = str(base_dir) if base_dir is not None else None
    return PlanCheck(plan, [], warnings)


def parse_plan(data: Any, source: str | Path | None = None) -> Plan:
    """A validated `Plan` from parsed JSON; raises `PlanError` listing every problem."""
    result = check_plan_data(data, Path(source).resolve().parent if source else None)
    if result.plan is None:
        raise PlanError(result.errors, source)
    return result.plan


def load_plan(path: str | Path) -> Plan:
    """A validated `Plan` from a plan file; raises `PlanError` listing every problem."""
    result = check_plan_file(path)
    if result.plan is None:
        raise PlanError(result.errors, path)
    return result.plan


# --- pass 1: pydantic errors as JSON-path lines ---


def json_path(loc: Sequence[str | int]) -> str:
    """`("arms", 1, "lr")` -> `arms[1].lr`; the empty path is `$`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "$"


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        path = json_path(err["loc"])
        if err["type"] == "missing":
            problems.append(Problem(path, "required field is missing"))
            continue
        msg = re.sub(r"^Input should be ", "expected ", err["msg"])
        got = err.get("input")
        problems.append(Problem(path, f"{msg}, got {_show(got)} ({type(got).__name__})"))
    return problems


def _unknown_field_warnings(model: BaseModel, path: str) -> Iterator[Problem]:
    """Fields the schema does not know, kept in the model and reported, never dropped."""
    for key in model.model_extra or {}:
        sub = f"{path}.{key}" if path != "$" else key
        if isinstance(model, ExperimentFeatures):
            yield Problem(sub, "unknown experiment feature (false); kept, not used")
        else:
            yield Problem(sub, "unknown field; kept as written, not used by this losslab version")
    for name in type(model).model_fields:
        value = getattr(model, name)
        sub = f"{path}.{name}" if path != "$" else name
        if isinstance(value, BaseModel):
            yield from _unknown_field_warnings(value, sub)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _unknown_field_warnings(item, f"{sub}[{i}]")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, BaseModel):
                    yield from _unknown_field_warnings(item, f"{sub}.{key}")


# --- pass 2: relations between fields, on the raw JSON ---


class _Checker:
    """Cross-field rules on the raw JSON; `errors` and `warnings` collect `Problem`s."""

    def __init__(self, data: dict[str, Any], base_dir: str | Path | None = None) -> None:
        self.d = data
        self.base_dir = base_dir
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []
        self.losses: dict[Any, ResolvedLoss] = {}  # arm name -> its loss, resolved once
        self.resolved: dict[str, ResolvedLoss] = {}  # "arms[i].loss" -> the same value
        self.arms = list(_list(data.get("arms")))
        switch = data.get("switch", "loss")
        self.switch = switch if isinstance(switch, str) else "loss"

    def err(self, path: str, message: str) -> None:
        self.errors.append(Problem(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(Problem(path, message))

    def run(self) -> None:
        self.check_features()
        self.check_texts()
        self.check_arms()
        self.check_names()
        self.check_engine()
        self.check_losses()
        self.check_loss_path()
        self.errors.extend(recomputed_anchor_problems(self.d))
        self.check_batch_relations()
        self.check_preflight()
        self.check_gate()
        self.check_restoration()
        self.check_decision_rule()
        self.check_budget()
        self.check_prose()

    # --- helpers ---

    def engine(self, key: str) -> tuple[Any, str]:
        """An engine setting's effective value and its source (`plan` or `default`)."""
        raw = _dict(self.d.get("engine"))
        default = EngineSettings.model_fields[key].default
        if key in raw:
            value = raw[key]
            ok = _num(value) is not None if isinstance(default, float) else _int(value) is not None
            if ok:
                return value, "plan"
        return default, "default"

    def updates(self) -> list[tuple[int, int]]:
        """(arm index, updates_per_batch) for each arm whose value is a valid integer >= 1."""
        out = []
        for i, arm in enumerate(self.arms):
            u = _int(_dict(arm).get("updates_per_batch", 1))
            if u is not None and u >= 1:
                out.append((i, u))
        return out

    def arm_keys(self) -> dict[str, int]:
        """Role and name -> arm index."""
        keys: dict[str, int] = {}
        for i, arm in enumerate(self.arms):
            arm = _dict(arm)
            role = arm.get("role") if arm.get("role") in ARM_ROLES else ARM_ROLES[min(i, 1)]
            keys.setdefault(role, i)
            if isinstance(arm.get("name"), str):
                keys.setdefault(arm["name"], i)
        return keys

    # --- rules ---

    def check_features(self) -> None:
        feats = _dict(self.d.get("experiment_features"))
        for key, value in feats.items():
            if value is not True:
                continue
            path = f"experiment_features.{key}"
            if key in NOT_IMPLEMENTED_FEATURES:
                self.err(path, f"true is not implemented ({NOT_IMPLEMENTED_FEATURES[key]})")
            elif key not in IMPLEMENTED_FEATURES:
                self.err(path, "unknown experiment feature set to true; not implemented by losslab")

    def check_texts(self) -> None:
        """Required text fields that say nothing: a report titled "" names no experiment."""
        for key in ("title", "hypothesis", "base_model"):
            value = self.d.get(key)
            if isinstance(value, str) and not value.strip():
                self.err(key, "is empty; write what it names (it heads the report and the run)")
        dataset_name = _dict(self.d.get("dataset")).get("name")
        if isinstance(dataset_name, str) and not dataset_name.strip():
            self.err("dataset.name", "is empty; name the task's dataset (e.g. gsm8k)")

    def check_names(self) -> None:
        """The safe-name rule (`losslab.plan.names`) on every plan string that becomes part of
        a file name: arm names (folders, eval files, checkpoints), and no two arm names that
        differ only in case (one folder on a case-insensitive file system)."""
        folded: dict[str, int] = {}
        for i, arm in enumerate(self.arms):
            name = _dict(arm).get("name")
            if not isinstance(name, str):
                continue
            problem = name_problem(
                name, "an arm's name names its folder arms/<name>/ and its file eval_<name>.jsonl"
            )
            if problem is not None:
                self.err(f"arms[{i}].name", problem)
                continue
            key = name.casefold()
            if key in folded and self.arms[folded[key]].get("name") != name:
                self.err(
                    f"arms[{i}].name",
                    f"{name!r} differs from arms[{folded[key]}].name only in case; on a "
                    "case-insensitive file system both arms would share one folder",
                )
            folded.setdefault(key, i)

    def check_engine(self) -> None:
        """The backend and the task are names from their registries, checked here rather than
        when the run starts: `backends.registry` and `tasks.registry` are stdlib-only tables."""
        engine = _dict(self.d.get("engine"))
        backend = engine.get("backend")
        if isinstance(backend, str) and backend not in BACKENDS:
            self.err(
                "engine.backend",
                f"{backend!r} is not a backend; expected one of {', '.join(map(repr, BACKENDS))} "
                "(or leave it out to choose with --backend)",
            )
        task_path = "engine.task" if isinstance(engine.get("task"), str) else "dataset.name"
        task = engine.get("task") if task_path == "engine.task" else None
        if task is None:
            task = _dict(self.d.get("dataset")).get("name")
        if isinstance(task, str) and task.strip():
            problem = task_name_problem(task)
            if problem is not None:
                self.err(task_path, problem)

    def check_arms(self) -> None:
        arms_raw = self.d.get("arms")
        if not isinstance(arms_raw, list):
            return
        if len(arms_raw) != 2:
            self.err("arms", f"expected exactly 2 arms (baseline, treatment), got {len(arms_raw)}")
        if "switch" in self.d and isinstance(self.d["switch"], str):
            if self.d["switch"] not in ARM_SWITCHABLE:
                self.err(
                    "switch",
                    f"{self.d['switch']!r} is not an arm field; expected one of "
                    f"{', '.join(ARM_SWITCHABLE)}",
                )
                return
        names: dict[str, int] = {}
        roles: dict[str, int] = {}
        for i, arm in enumerate(arms_raw):
            arm = _dict(arm)
            name = arm.get("name")
            if isinstance(name, str):
                if name in names:
                    self.err(f"arms[{i}].name", f"{name!r} repeats arms[{names[name]}].name")
                names.setdefault(name, i)
            role = arm.get("role")
            if role in ARM_ROLES:
                if role in roles:
                    self.err(f"arms[{i}].role", f"{role!r} repeats arms[{roles[role]}].role")
                roles.setdefault(role, i)
        if len(arms_raw) < 2 or not all(isinstance(a, dict) for a in arms_raw):
            return
        base_model = self.d.get("base_model")
        for i, arm in enumerate(arms_raw):
            if "base_model" in arm and base_model is not None and arm["base_model"] != base_model:
                self.err(
                    f"arms[{i}].base_model",
                    f"{_show(arm['base_model'])} differs from base_model {_show(base_model)}; "
                    "both arms start from the plan's base model",
                )
        effective = []
        for arm in arms_raw:
            eff = {k: v for k, v in arm.items() if k not in ("name", "role", "base_model")}
            eff.setdefault("updates_per_batch", 1)
            effective.append(eff)
        first = effective[0]
        for i, eff in enumerate(effective[1:], start=1):
            for key in sorted(set(first) | set(eff), key=_arm_key_order):
                if key == self.switch:
                    continue
                a, b = first.get(key, _ABSENT), eff.get(key, _ABSENT)
                if key in _REQUIRED_ARM_FIELDS and (a is _ABSENT or b is _ABSENT):
                    continue  # pass 1 reports the missing field
                if not _same_kind(a, b):
                    continue  # pass 1 reports the value of the wrong type
                if a != b:
                    self.err(
                        f"arms[{i}].{key}",
                        f"{_show_abs(b)} differs from arms[0].{key} {_show_abs(a)}; "
                        f"arms may differ only in {self.switch!r}",
                    )
            if first.get(self.switch, _ABSENT) == eff.get(self.switch, _ABSENT):
                self.err(
                    f"arms[{i}].{self.switch}",
                    f"{_show_abs(eff.get(self.switch, _ABSENT))} equals arms[0].{self.switch}; "
                    f"the arms must differ in their switch {self.switch!r}",
                )

    def _loss_revisions(self) -> tuple[str | None, str | None]:
        paths = _list(_dict(self.d.get("correctness_preflight")).get("paths"))
        for path in paths:
            path = _dict(path)
            if path.get("kind", "loss") == "loss":
                b, r = path.get("baseline_revision"), path.get("reference_revision")
                return (b if isinstance(b, str) else None, r if isinstance(r, str) else None)
        return None, None

    def check_losses(self) -> None:
        """Resolve every arm's loss once; the results become `Plan.loss(arm)`."""
        baseline_rev, reference_rev = self._loss_revisions()
        for i, arm in enumerate(self.arms):
            loss = _dict(arm).get("loss")
            if not isinstance(loss, str):
                continue
            try:
                resolved = resolve_loss(loss, baseline_rev, reference_rev, base_dir=self.base_dir)
            except LossNameError as exc:
                self.err(f"arms[{i}].loss", str(exc))
            else:
                declared = LOSSES.get(resolved.name)
                if declared is not None and not declared.reads_policy_inputs:
                    self.err(
                        f"arms[{i}].loss",
                        f"{loss!r} resolves to {resolved.name}, which reads neither advantages "
                        "nor sampler log-probs: it cannot train an RL arm (training_type 'rl')",
                    )
                name = _dict(arm).get("name")
                if isinstance(name, str):  # any other name is pass 1's error (and unhashable)
                    self.losses[name] = resolved
                self.resolved[f"arms[{i}].loss"] = resolved

    def check_loss_path(self) -> None:
        """`engine.loss_path: builtin` needs a Tinker built-in computing every arm's loss."""
        if _dict(self.d.get("engine")).get("loss_path") != "builtin":
            return
        from losslab.losses.tinker_builtins import builtin_request

        for where, resolved in self.resolved.items():
            declaration = LOSSES.get(resolved.name)
            if declaration is None:
                continue  # not a registry loss: check_losses named it
            try:
                builtin_request(resolved.name, declaration.resolve(resolved.values))
            except ValueError as exc:
                self.err(where, f"engine.loss_path is 'builtin': {exc}")

    def check_batch_relations(self) -> None:
        steps = _int(self.d.get("steps"))
        gs, gs_src = self.engine("group_size")
        gpb, gpb_src = self.engine("groups_per_batch")
        upd = self.updates()
        if steps is not None and steps > 0:
            for i, u in upd:
                if steps % u:
                    self.err(
                        "steps",
                        f"{steps} is not divisible by arms[{i}].updates_per_batch {u}; steps counts "
                        "optim steps = rollout steps x updates per batch",
                    )
                    break
        batch = _int(self.d.get("batch_size"))
        if batch is not None and gs >= 1 and gpb >= 1 and batch != gs * gpb:
            self.err(
                "batch_size",
                f"{batch} != engine.groups_per_batch {gpb} ({gpb_src}) x engine.group_size "
                f"{gs} ({gs_src}) = {gs * gpb}",
            )
        if gpb >= 1:
            for i, u in upd:
                if gpb % u:
                    self.err(
                        "engine.groups_per_batch",
                        f"{gpb} ({gpb_src}) is not divisible by arms[{i}].updates_per_batch {u}; "
                        "each update takes a minibatch of whole groups",
                    )
                    break
        n_train = _int(_dict(self.d.get("dataset")).get("n_examples"))
        if steps and upd and n_train and steps % upd[0][1] == 0 and gpb >= 1:
            need = steps // upd[0][1] * gpb
            if need > n_train:
                self.err(
                    "dataset.n_examples",
                    f"{n_train} prompts, but {steps // upd[0][1]} rollout steps x "
                    f"groups_per_batch {gpb} need {need}",
                )
        max_tokens, mt_src = self.engine("max_tokens")
        max_seq = _int(self.d.get("max_seq_len"))
        if max_seq is not None and max_tokens >= max_seq:
            self.err(
                "engine.max_tokens",
                f"{max_tokens} ({mt_src}) leaves no room for the prompt within max_seq_len {max_seq}",
            )

    def check_preflight(self) -> None:
        paths = _list(_dict(self.d.get("correctness_preflight")).get("paths"))
        seen: dict[str, int] = {}
        for i, path in enumerate(paths):
            path = _dict(path)
            pid = path.get("id")
            if isinstance(pid, str):
                if pid in seen:
                    self.err(
                        f"correctness_preflight.paths[{i}].id",
                        f"{pid!r} repeats paths[{seen[pid]}]",
                    )
                seen.setdefault(pid, i)
            for key in ("baseline_revision", "reference_revision"):
                text = path.get(key)
                if not isinstance(text, str):
                    continue
                where = f"correctness_preflight.paths[{i}].{key}"
                try:
                    revision = parse_revision(text)
                    if key == "baseline_revision" and path.get("kind", "loss") == "loss":
                        pinned_clip(revision)  # a NaN or half pin would check nothing
                except RevisionError as exc:
                    self.err(where, str(exc))
            for key, tol in _dict(path.get("tolerances")).items():
                base = f"correctness_preflight.paths[{i}].tolerances.{key}"
                for name in ("atol", "rtol"):
                    v = _num(_dict(tol).get(name))
                    if v is not None and (v < 0 or math.isnan(v)):
                        self.err(f"{base}.{name}", f"{_fmt_num(v)} must be >= 0")
                cos = _num(_dict(tol).get("min_cosine"))
                if cos is not None and not -1 <= cos <= 1:
                    self.err(f"{base}.min_cosine", f"{_fmt_num(cos)} is outside [-1, 1]")

    def check_gate(self) -> None:
        gate = _dict(self.d.get("activation_gate"))
        checks = _list(gate.get("checks"))
        if gate.get("applicable") is True and "checks" in gate and not checks:
            self.err("activation_gate.checks", "the gate is applicable but has no checks")
        raw_local = _dict(self.d.get("engine")).get("local_base_model")
        base_models = {m for m in (self.d.get("base_model"), raw_local) if isinstance(m, str)}
        for i, check in enumerate(checks):
            if not isinstance(check, dict):
                continue
            base = f"activation_gate.checks[{i}]"
            metric = check.get("metric")
            known = GATE_METRICS.get(metric) if isinstance(metric, str) else None
            if isinstance(metric, str) and known is None:
                self.err(
                    f"{base}.metric",
                    f"{metric!r} is not a gate metric; expected one of {', '.join(GATE_METRICS)}",
                )
            lo, hi = _num(check.get("min")), _num(check.get("max"))
            one_of = check.get("one_of")
            if check.get("min") is None and check.get("max") is None and one_of is None:
                self.err(base, "no bound; give min, max or one_of")
                continue
            if one_of is not None and (
                check.get("min") is not None or check.get("max") is not None
            ):
                self.err(f"{base}.one_of", "give either one_of or min/max, not both")
            if lo is not None and hi is not None and lo > hi:
                self.err(f"{base}.min", f"{_fmt_num(lo)} > max {_fmt_num(hi)}")
            if isinstance(one_of, list):
                if not one_of:
                    self.err(f"{base}.one_of", "is empty; no value could pass")
                for j, item in enumerate(one_of):
                    if not isinstance(item, str | int | float) or isinstance(item, bool):
                        self.err(
                            f"{base}.one_of[{j}]", f"expected a string or number, got {_show(item)}"
                        )
            if known is None:
                continue
            if gate.get("applicable", True) is not False:
                self.check_gate_source(f"{base}.metric", metric, known)
            if known.kind == "name" and (lo is not None or hi is not None):
                self.err(
                    f"{base}.{'min' if lo is not None else 'max'}",
                    f"{metric} is a name; bound it with one_of",
                )
            if known.kind == "fraction":
                for key, v in (("min", lo), ("max", hi)):
                    if v is not None and not 0 <= v <= 1:
                        self.err(
                            f"{base}.{key}",
                            f"{_fmt_num(v)} is outside [0, 1] for the fraction {metric}",
                        )
            if known.kind == "nonnegative" and lo is not None and lo < 0:
                self.err(f"{base}.min", f"{_fmt_num(lo)} is below 0, the least {metric} can be")
            if metric == "executed_updates_per_batch":
                for j, u in self.updates():
                    allowed = (
                        [x for x in one_of if _num(x) is not None]
                        if isinstance(one_of, list)
                        else None
                    )
                    if (
                        (lo is not None and u < lo)
                        or (hi is not None and u > hi)
                        or (allowed is not None and u not in allowed)
                    ):
                        self.err(
                            base,
                            f"excludes arms[{j}].updates_per_batch {u}; the planned config could "
                            "never pass",
                        )
                        break
            if metric == "executed_base_model" and isinstance(one_of, list) and one_of:
                if base_models and not base_models & {x for x in one_of if isinstance(x, str)}:
                    self.err(
                        f"{base}.one_of",
                        f"{_show(one_of)} does not include base_model {_show(self.d.get('base_model'))}",
                    )

    def check_gate_source(self, path: str, metric: str, known: GateMetric) -> None:
        """Refuse a gate check on a loss's metric that the arm's loss does not declare: the
        pilot would stop the run at the gate, after the preflights and the pilot steps."""
        role = known.loss_role
        index = self.arm_keys().get(role) if role is not None else None
        loss = self.resolved.get(f"arms[{index}].loss") if index is not None else None
        if loss is not None and loss.user is not None and loss.user.file is not None:
            # code declares no metrics: its source must at least name the key it logs
            source = Path(loss.user.file).read_text(encoding="utf-8")
            if f'"{known.logged_key}"' not in source and f"'{known.logged_key}'" not in source:
                self.err(
                    path,
                    f"{metric!r} reads {known.logged_key!r} from the {role} arm's loss, "
                    f"{loss.user.file}::{loss.user.function}, whose source never names that key; "
                    f"return it in the metrics dict (metrics[{known.logged_key!r}] = ...)",
                )
            return
        if loss is None or loss.name not in LOSSES:  # no such arm or loss: reported elsewhere
            return
        declared = LOSSES[loss.name].metrics
        if known.logged_key not in declared:
            side = " (a side loss on the treatment arm's batches)" if known.side_loss else ""
            self.err(
                path,
                f"{metric!r} reads {known.logged_key!r} from the {role} arm's loss{side}, {loss.name} "
                f"(arms[{index}].loss {loss.plan_name!r}), which does not log it; "
                f"{loss.name} logs {', '.join(declared)}",
            )

    def check_restoration(self) -> None:
        groups = _list(_dict(self.d.get("restoration_preflight")).get("groups"))
        arm_index = {
            a["name"]: i for i, a in enumerate(self.arms) if isinstance(_dict(a).get("name"), str)
        }
        optimizer = _dict(self.d.get("optimizer"))
        opt_name = optimizer.get("name")
        for g, group in enumerate(groups):
            r_arms = _list(_dict(group).get("arms"))
            first_cfg: dict[str, Any] | None = None
            for j, r_arm in enumerate(r_arms):
                r_arm = _dict(r_arm)
                base = f"restoration_preflight.groups[{g}].arms[{j}]"
                name = r_arm.get("name")
                if isinstance(name, str) and name not in arm_index:
                    self.err(f"{base}.name", f"{name!r} is not an arm; arms: {sorted(arm_index)}")
                if isinstance(r_arm.get("optimizer"), str) and isinstance(opt_name, str):
                    if r_arm["optimizer"] != opt_name:
                        self.err(
                            f"{base}.optimizer",
                            f"{r_arm['optimizer']!r} differs from optimizer.name {opt_name!r}",
                        )
                cfg = _dict(r_arm.get("optimizer_config"))
                lr = _num(cfg.get("learning_rate"))
                if lr is not None and isinstance(name, str) and name in arm_index:
                    k = arm_index[name]
                    arm_lr = _num(_dict(self.arms[k]).get("lr"))
                    if arm_lr is not None and lr != arm_lr:
                        self.err(
                            f"{base}.optimizer_config.learning_rate",
                            f"{lr!r} differs from arms[{k}].lr {arm_lr!r}",
                        )
                for key in ADAM_DEFAULTS:
                    plan_v, cfg_v = _num(optimizer.get(key)), _num(cfg.get(key))
                    if plan_v is not None and cfg_v is not None and plan_v != cfg_v:
                        self.err(
                            f"{base}.optimizer_config.{key}",
                            f"{cfg_v!r} differs from optimizer.{key} {plan_v!r}",
                        )
                if first_cfg is None:
                    first_cfg = cfg
                    continue
                for key in sorted(set(first_cfg) | set(cfg)):
                    if self.switch == "lr" and key == "learning_rate":
                        continue
                    a, b = first_cfg.get(key, _ABSENT), cfg.get(key, _ABSENT)
                    if a != b:
                        self.err(
                            f"{base}.optimizer_config.{key}",
                            f"{_show_abs(b)} differs from groups[{g}].arms[0].optimizer_config.{key} "
                            f"{_show_abs(a)}; arms may differ only in {self.switch!r}",
                        )

    def check_decision_rule(self) -> None:
        rule = _dict(self.d.get("decision_rule"))
        alpha = _num(rule.get("alpha"))
        if alpha is not None and not 0 < alpha < 1:
            self.err("decision_rule.alpha", f"{_fmt_num(alpha)} is outside (0, 1)")
        elif alpha is not None and 1.0 - alpha == 1.0:  # alpha below 2**-54, about 5.6e-17
            self.err(
                "decision_rule.alpha",
                f"{_fmt_num(alpha)} is so small that the confidence level 1 - alpha rounds to 1 "
                "in floating point: no interval could be stated; use e.g. 0.05",
            )
        version = _int(rule.get("version"))
        if version is not None and version != 1:
            self.err(
                "decision_rule.version", f"{version} is not supported; this losslab reads version 1"
            )
        seeds = [s for s in _list(rule.get("seeds")) if _int(s) is not None]
        if seeds:
            for i, arm in enumerate(self.arms):
                seed = _int(_dict(arm).get("seed"))
                if seed is not None and seed not in seeds:
                    self.err(f"arms[{i}].seed", f"{seed} is not in decision_rule.seeds {seeds}")
        arm_keys = self.arm_keys()
        ids: dict[str, int] = {}
        for c, crit in enumerate(_list(rule.get("criteria"))):
            crit = _dict(crit)
            base = f"decision_rule.criteria[{c}]"
            cid = crit.get("id")
            if isinstance(cid, str):
                if cid in ids:
                    self.err(f"{base}.id", f"{cid!r} repeats criteria[{ids[cid]}].id")
                ids.setdefault(cid, c)
            metric = crit.get("metric")
            if isinstance(metric, str) and metric not in EVAL_METRICS:
                self.err(
                    f"{base}.metric",
                    f"{metric!r} is not a per-item evaluation metric; expected one of "
                    f"{', '.join(EVAL_METRICS)}",
                )
            weights = crit.get("weights")
            good_weights: dict[str, float] = {}
            if isinstance(weights, dict):
                if not weights:
                    self.err(f"{base}.weights", "is empty; name at least one arm")
                used: dict[int, str] = {}
                for key, w in weights.items():
                    if key not in arm_keys:
                        self.err(
                            f"{base}.weights.{key}",
                            f"is neither an arm role ({', '.join(ARM_ROLES)}) nor an arm name",
                        )
                    elif arm_keys[key] in used:
                        self.err(
                            f"{base}.weights.{key}",
                            f"names the same arm as weights.{used[arm_keys[key]]}",
                        )
                    else:
                        used[arm_keys[key]] = key
                    if _num(w) is not None:
                        if not math.isfinite(w) or w == 0:
                            self.err(
                                f"{base}.weights.{key}", f"{_fmt_num(w)} must be finite and nonzero"
                            )
                        else:
                            good_weights[key] = float(w)
            bounds = crit.get("bounds")
            good_bounds = None
            if isinstance(bounds, list):
                nums = [_num(b) for b in bounds]
                if len(bounds) != 2 or None in nums or not nums[0] < nums[1]:  # type: ignore[operator]
                    if all(n is not None for n in nums):
                        self.err(
                            f"{base}.bounds",
                            f"expected [low, high] with low < high, got {_show(bounds)}",
                        )
                else:
                    good_bounds = nums
            margin = _num(crit.get("margin", 0.0))
            if (
                good_bounds is not None
                and isinstance(weights, dict)
                and len(good_weights) == len(weights) > 0
                and not self.check_weight_range(base, good_weights, good_bounds)  # type: ignore[arg-type]
            ):
                continue
            if (
                margin is not None
                and good_bounds is not None
                and isinstance(weights, dict)
                and len(good_weights) == len(weights) > 0
            ):
                low, high = weighted_range(good_weights, good_bounds)  # type: ignore[arg-type]
                if not low < margin < high:  # at low nothing is refuted, at high nothing validated
                    self.err(
                        f"{base}.margin",
                        f"{_fmt_num(margin)} is not inside ({_fmt_num(low)}, {_fmt_num(high)}), the "
                        "open range of the weighted difference; the verdict would be fixed before "
                        "any data",
                    )

    def check_weight_range(self, base: str, weights: dict[str, float], bounds: list[float]) -> bool:
        """Refuse weights and bounds whose per-item difference leaves the floating-point range:
        each term w * (high - low) must be a normal float (5e-324 underflows to a subnormal that
        rounding erases) and the range of the weighted sum finite (+-1e308 overflows to inf, and
        an infinite range makes every verdict 'inconclusive'). False when refused."""
        span = bounds[1] - bounds[0]
        if not math.isfinite(span):
            self.err(f"{base}.bounds", f"high - low of {_show(bounds)} overflows to inf")
            return False
        ok = True
        for key, w in weights.items():
            term = abs(w) * span
            if not math.isfinite(term) or term < sys.float_info.min:
                self.err(
                    f"{base}.weights.{key}",
                    f"{_fmt_num(w)} x the bounds' span {_fmt_num(span)} is {_fmt_num(term)}, outside "
                    f"the normal floating-point range [{sys.float_info.min:.3g}, "
                    f"{sys.float_info.max:.3g}]; scale the weights (e.g. +1 and -1)",
                )
                ok = False
        if ok:
            low, high = weighted_range(weights, bounds)
            if not math.isfinite(high - low):
                self.err(
                    f"{base}.weights",
                    f"the weighted difference spans [{_fmt_num(low)}, {_fmt_num(high)}], whose width "
                    "overflows to inf; scale the weights (e.g. +1 and -1)",
                )
                ok = False
        return ok

    def check_budget(self) -> None:
        budget = self.d.get("budget")
        if not isinstance(budget, dict):
            return
        present = False
        for key in ("gpu_hours", "max_wall_minutes"):
            v = _num(budget.get(key))
            if v is not None:
                present = True
                if not v > 0 or not math.isfinite(v):
                    self.err(f"budget.{key}", f"{_fmt_num(v)} must be a positive number")
        if not present and all(budget.get(k) is None for k in ("gpu_hours", "max_wall_minutes")):
            self.err("budget", "give gpu_hours or max_wall_minutes (or both)")

    def check_prose(self) -> None:
        """Warn when the method text states an engine value other than the one in effect."""
        text = "\n".join(
            t for t in (self.d.get("method"), self.d.get("command")) if isinstance(t, str)
        )
        for key, pattern in _PROSE_PATTERNS.items():
            value, source = self.engine(key)
            for match in re.finditer(pattern, text):
                stated = float(match.group(1))
                if stated != float(value):
                    self.warn(
                        f"engine.{key}",
                        f"the plan's text says {match.group(0).strip()!r} but the engine uses "
                        f"{value} ({source}); set engine.{key} to what you mean",
                    )
                    break


_PROSE_PATTERNS = {
    "group_size": r"group_size\s*=\s*(\d+)",
    "groups_per_batch": r"groups_per_batch\s*=\s*(\d+)",
    "max_tokens": r"(?<![_a-z])max_tokens\s*=\s*(\d+)",
    "temperature": r"temperature\s*=?\s*(\d+(?:\.\d+)?)",
}


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def recomputed_anchor_problems(data: Mapping[str, Any]) -> list[Problem]:
    """Refuse a plan whose loss needs recomputed old log-probs (`*_recompute` modes, an
    `anchor`/`weight_anchor` of "recomputed"): the engine trains on sampler log-probs only and
    never computes old ones, so such a loss would fail in the preflight and could not train.
    The problem names the JSON field that asks for it."""
    problems = []
    paths = _list(_dict(data.get("correctness_preflight")).get("paths"))
    for j, path in enumerate(paths):
        rev = _dict(path).get("reference_revision")
        if isinstance(rev, str) and "_recompute" in rev:
            problems.append(
                Problem(
                    f"correctness_preflight.paths[{j}].reference_revision",
                    "asks for a *_recompute loss_mode (trust region against recomputed old "
                    "log-probs); losslab's engine trains on sampler log-probs only and never "
                    "computes old ones, so the preflight could not check it and the arm could "
                    "not train; pin the rollout-anchored mode (e.g. loss_mode='dppo_binary_tv')",
                )
            )
    for i, arm in enumerate(_list(data.get("arms"))):
        loss = _dict(arm).get("loss")
        if isinstance(loss, str) and re.search(r"\b(weight_)?anchor\s*=\s*['\"]?recomputed", loss):
            problems.append(
                Problem(
                    f"arms[{i}].loss",
                    f"{loss!r} anchors on recomputed old log-probs, which the engine never "
                    "computes; use anchor=sampler",
                )
            )
    return problems


def _show_abs(value: Any) -> str:
    return "(absent)" if value is _ABSENT else _show(value)


_REQUIRED_ARM_FIELDS = ("loss", "seed", "lr")


def _same_kind(a: Any, b: Any) -> bool:
    """Both numbers, or both of one JSON type (absent counts as any kind)."""
    if a is _ABSENT or b is _ABSENT:
        return True
    if _num(a) is not None and _num(b) is not None:
        return True
    return type(a) is type(b)


_ARM_FIELD_ORDER = ("loss", "seed", "lr", "updates_per_batch", "base_model")


def _arm_key_order(key: str) -> tuple[int, str]:
    return (_ARM_FIELD_ORDER.index(key) if key in _ARM_FIELD_ORDER else len(_ARM_FIELD_ORDER), key)

"""An arm's loss written as code: the researcher's file, an importable module, a pinned function.

Three spec forms besides a registry name (`losslab.plan.loss_names`):

    path/to/file.py::function(key=value, ...)                 the path relative to the plan's folder
    package.module:function(key=value, ...)                   an importable module
    owner/repo@<40-hex commit>:path.py::function(key=value, ...)   a framework's pinned function

Stdlib only: `plan check` reads the file (or finds the module's file without importing it) and
inspects the function with `ast`, so a missing file, a syntax error, a missing function, a
signature of none of the three known forms or an unknown parameter is refused without torch.
What `ast` cannot see (the import itself, the returned value) is checked when the loss is built
(`losslab.conformance.user_loss`), before any run directory exists. A pinned function's source
is fetched then; at plan check only its text is read.

The signature is detected, never configured (`detect_signature`):

- "tinker": `fn(data, logprobs_list, **params) -> (loss, metrics)`, Tinker's custom loss
  (`TrainingClient.forward_backward_custom`, the cookbook's form);
- "verl": `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, ...)`,
  verl's policy losses; the spec's keywords are the `config` fields the function reads;
- "losslab": `fn(batch, **params) -> LossOutput`, losslab's own form.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from losslab.callspec import CallSpecError, parse_call
from losslab.plan.files import UnreadableFile, read_regular_text, repo_path_problem

SIGNATURES: dict[str, str] = {
    "tinker": "a Tinker custom loss fn(data: list[tinker.Datum], logprobs_list: "
    "list[torch.Tensor], **params) -> (loss, metrics)",
    "verl": "a verl policy loss fn(old_log_prob, log_prob, advantages, response_mask, "
    "loss_agg_mode, config, ...) -> (loss, metrics)",
    "losslab": "a losslab loss fn(batch: TokenData, **params) -> LossOutput",
}
EXPECTED_SIGNATURES = "; or ".join(SIGNATURES.values())
VERL_TENSORS = ("old_log_prob", "log_prob", "advantages", "response_mask")
VERL_CALL_ARGS = (*VERL_TENSORS, "loss_agg_mode", "config", "rollout_is_weights")
_TINKER_DATA = ("data", "datums")
_TINKER_LOGPROBS = ("logprobs_list", "logprobs")

_PINNED = re.compile(
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<commit>[0-9a-fA-F]+)"
    r":(?P<path>[^:\s]+\.py)::(?P<call>[A-Za-z_][A-Za-z0-9_]*\s*(?:\(.*\))?)\s*",
    re.DOTALL,
)
_FILE = re.compile(
    r"(?P<path>[^:()]+\.py)::(?P<call>[A-Za-z_][A-Za-z0-9_]*\s*(?:\(.*\))?)\s*", re.DOTALL
)
_MODULE = re.compile(
    r"(?P<module>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r":(?P<call>[A-Za-z_][A-Za-z0-9_]*\s*(?:\(.*\))?)\s*",
    re.DOTALL,
)


class UserLossError(ValueError):
    """A loss named as code that cannot be used; the message names the file, the function and
    what was expected."""


@dataclass(frozen=True)
class SignatureInfo:
    """What the function's parameter list says (from `ast` or `inspect`)."""

    kind: str  # a key of SIGNATURES
    params: tuple[str, ...]  # the keyword parameters a spec may set
    required: tuple[str, ...]  # those without a default
    var_keyword: bool  # **params: any keyword is accepted
    config_fields: tuple[str, ...] = ()  # verl: the `config` fields the body reads


@dataclass(frozen=True)
class UserLossRef:
    """An arm's loss named as code, resolved at plan time (the value `ResolvedLoss.user` holds).

    `file` is the absolute path of the source file (file and module forms; None for a pinned
    function before it is fetched), `sha256` its bytes' hash, `git` `{"commit", "dirty",
    "root"}` when the file lives in a git work tree.
    """

    kind: str  # "file", "module" or "pinned"
    text: str
    function: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    file: str | None = None
    module: str | None = None
    repo: str | None = None
    commit: str | None = None
    path: str | None = None  # the pinned function's path in its repository
    sha256: str | None = None
    git: Mapping[str, Any] | None = None
    signature: SignatureInfo | None = None

    @property
    def short(self) -> str:
        """`my_dppo.py @ 3f2a9c1e` for labels: the file name and the first hex of its hash (or
        the pinned commit)."""
        if self.kind == "pinned":
            return f"{self.repo}@{(self.commit or '')[:8]}:{self.path}::{self.function}"
        name = Path(self.file or self.module or "?").name
        return f"{name}::{self.function} @ sha256 {(self.sha256 or '?')[:12]}"

    def provenance(self) -> dict[str, Any]:
        """The record the manifest, preflight.json and the report carry."""
        return {
            "kind": self.kind,
            "spec": self.text,
            "function": self.function,
            "file": self.file,
            "module": self.module,
            "repo": self.repo,
            "commit": self.commit,
            "path": self.path,
            "sha256": self.sha256,
            "git": dict(self.git) if self.git else None,
            "signature": self.signature.kind if self.signature else None,
            "summary": f"your code: {self.short}"
            + (
                f" (git {self.git['commit'][:12]}{', dirty' if self.git['dirty'] else ''})"
                if self.git
                else ""
            ),
        }


def is_user_loss_spec(text: str) -> bool:
    """Whether `text` is one of the three code forms (not a registry name or plan loss name)."""
    head = text.split("(", 1)[0]
    return "::" in head or ":" in head


def parse_user_loss(text: str, base_dir: Path | None = None) -> UserLossRef:
    """Parse and statically check a code-form loss spec (module docstring).

    Args:
        text: the arm's `loss`.
        base_dir: the plan file's folder; a file path is relative to it (default: the current
            directory).

    Raises:
        UserLossError: the text is not of a known form, its arguments do not parse, the file or
            module cannot be found or parsed, the function is missing, its signature is none of
            the known forms, or a keyword is not one of its parameters.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    pinned = _PINNED.fullmatch(text)
    if pinned:
        if not re.fullmatch(r"[0-9a-fA-F]{40}", pinned["commit"]):
            raise UserLossError(
                f"loss {text!r}: commit {pinned['commit']!r} is not 40 hex digits; a pinned "
                "function names the full commit (owner/repo@<40-hex>:path.py::function(...))"
            )
        path_problem = repo_path_problem(pinned["path"])
        if path_problem is not None:
            raise UserLossError(f"loss {text!r}: path {pinned['path']!r} {path_problem}")
        function, kwargs = _call(text, pinned["call"])
        return UserLossRef(
            "pinned",
            text,
            function,
            kwargs,
            repo=pinned["repo"],
            commit=pinned["commit"].lower(),
            path=pinned["path"],
        )
    match = _FILE.fullmatch(text)
    if match:
        file = (base / match["path"]).resolve()
        function, kwargs = _call(text, match["call"])
        return _source_ref("file", text, function, kwargs, file)
    match = _MODULE.fullmatch(text)
    if match:
        function, kwargs = _call(text, match["call"])
        file = find_module_file(match["module"], [str(base), str(Path.cwd())])
        if file is None:
            raise UserLossError(
                f"loss {text!r}: module {match['module']!r} is not importable (not found on "
                f"sys.path, in the plan's folder {base} or the current directory); expected "
                "package.module:function(...)"
            )
        return _source_ref("module", text, function, kwargs, file, module=match["module"])
    raise UserLossError(
        f"loss {text!r} is not a loss named as code; expected path/file.py::function(k=v, ...), "
        "package.module:function(k=v, ...) or owner/repo@<40-hex commit>:path.py::function(...)"
    )


def _source_ref(
    kind: str, text: str, function: str, kwargs: dict[str, Any], file: Path, **where: str
) -> UserLossRef:
    """A file or module loss: its source read, hashed, its git state and its signature
    inspected where it lies (`where`: the module name of a module loss)."""
    source = _read(text, file)
    return UserLossRef(
        kind,
        text,
        function,
        kwargs,
        file=str(file),
        sha256=hashlib.sha256(source.encode("utf-8")).hexdigest(),
        git=git_state(file),
        signature=inspect_source(source, function, str(file), kwargs),
        **where,
    )


def _call(text: str, call: str) -> tuple[str, dict[str, Any]]:
    try:
        return parse_call(call, what="loss function call", bare_words=True)
    except CallSpecError as exc:
        raise UserLossError(f"loss {text!r}: {exc}") from None


MAX_SOURCE_BYTES = 16 << 20
"""Largest loss source file read (16 MiB); verl's core_algos.py, one of the largest loss
modules in the field, is under 100 KB."""


def _read(text: str, file: Path) -> str:
    """The source of a loss file: a regular file only, bounded (`losslab.plan.files`), so a
    `loss.py` that is a FIFO or a link to /dev/zero cannot hang or exhaust `plan check`."""
    try:
        return read_regular_text(file, MAX_SOURCE_BYTES, f"file {file}")
    except FileNotFoundError:
        raise UserLossError(
            f"loss {text!r}: file {file} does not exist (a path is relative to the plan's folder)"
        ) from None
    except UnreadableFile as exc:
        raise UserLossError(f"loss {text!r}: {exc}") from None


def find_module_file(module: str, extra_paths: Sequence[str] = ()) -> Path | None:
    """The source file of a dotted module, found the way `import` would, without importing it
    (nor its parent packages)."""
    parts = module.split(".")
    search: list[str] | None = [*extra_paths, *sys.path]
    spec = None
    for part in parts:
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def git_state(file: Path) -> dict[str, Any] | None:
    """`{"commit", "dirty", "root"}` of the git work tree holding `file` (dirty: the file differs
    from the commit), or None when it is in none (or git is absent)."""

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", "-C", str(file.parent), *args],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    root = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if root else None
    if not root or not commit:
        return None
    status = git("status", "--porcelain", "--", file.name)
    return {"commit": commit, "dirty": bool(status), "root": root}


def inspect_source(
    source: str, function: str, where: str, kwargs: Mapping[str, Any]
) -> SignatureInfo:
    """Find top-level `function` in `source` with `ast`, detect its form and check `kwargs`."""
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as exc:
        raise UserLossError(
            f"{where}: does not parse (line {exc.lineno}: {exc.msg}); expected a Python file "
            f"defining {function}"
        ) from None
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    node = defs.get(function)
    if node is None:
        found = ", ".join(sorted(defs)) or "none"
        raise UserLossError(
            f"{where}: no top-level function {function!r} (functions defined: {found}); "
            f"expected {EXPECTED_SIGNATURES}"
        )
    a = node.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    n_without_default = len(positional) - len(a.defaults)
    required_pos = positional[:n_without_default]
    kwonly_required = [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    info = detect_signature(
        positional,
        required_pos,
        [p.arg for p in a.kwonlyargs],
        kwonly_required,
        var_keyword=a.kwarg is not None,
        where=f"{where}::{function}",
        config_fields=_config_fields(node),
    )
    check_kwargs(info, kwargs, f"{where}::{function}")
    return info


def _config_fields(node: ast.AST) -> tuple[str, ...]:
    """The fields a verl loss reads of its `config`: `config.x`, `config.get("x")`,
    `config["x"]`."""
    out: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            if sub.value.id == "config" and sub.attr != "get":
                out.append(sub.attr)
        elif (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "get"
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id == "config"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
            and isinstance(sub.args[0].value, str)
        ):
            out.append(sub.args[0].value)
        elif (
            isinstance(sub, ast.Subscript)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "config"
            and isinstance(sub.slice, ast.Constant)
            and isinstance(sub.slice.value, str)
        ):
            out.append(sub.slice.value)
    return tuple(dict.fromkeys(out))


def detect_signature(
    positional: Sequence[str],
    required_positional: Sequence[str],
    keyword_only: Sequence[str],
    required_keyword_only: Sequence[str],
    *,
    var_keyword: bool,
    where: str,
    config_fields: Sequence[str] = (),
) -> SignatureInfo:
    """Which of the three forms a parameter list is (module docstring), or UserLossError."""
    names = [*positional, *keyword_only]
    if len(positional) >= 2 and positional[0] in _TINKER_DATA and positional[1] in _TINKER_LOGPROBS:
        rest = [*positional[2:], *keyword_only]
        required = [*required_positional[2:], *required_keyword_only]
        return SignatureInfo("tinker", tuple(rest), tuple(required), var_keyword)
    if all(t in names for t in VERL_TENSORS):
        rest = [n for n in names if n not in VERL_CALL_ARGS]
        required = [
            n for n in (*required_positional, *required_keyword_only) if n not in VERL_CALL_ARGS
        ]
        return SignatureInfo(
            "verl", tuple(rest), tuple(required), var_keyword, tuple(config_fields)
        )
    if positional and positional[0] == "batch":
        rest = [*positional[1:], *keyword_only]
        required = [*required_positional[1:], *required_keyword_only]
        return SignatureInfo("losslab", tuple(rest), tuple(required), var_keyword)
    shown = ", ".join(names) or "no parameters"
    raise UserLossError(
        f"{where}: its parameters ({shown}) are none of the known loss signatures; expected "
        f"{EXPECTED_SIGNATURES}"
    )


def check_kwargs(info: SignatureInfo, kwargs: Mapping[str, Any], where: str) -> None:
    """Refuse a keyword the function does not take and a required parameter the spec omits.

    A verl loss's keywords are its `config` fields (those its body reads), or its own extra
    parameters; a function with `**params` takes any keyword.
    """
    accepted = [*info.params, *info.config_fields]
    if info.kind == "verl" and "loss_agg_mode" not in accepted:
        accepted.append("loss_agg_mode")
    unknown = [k for k in kwargs if k not in accepted]
    if unknown and not info.var_keyword:
        what = "parameters and config fields" if info.kind == "verl" else "keyword parameters"
        raise UserLossError(
            f"{where}: unknown parameter {unknown[0]!r}; its {what} are "
            f"{', '.join(accepted) or 'none'} ({SIGNATURES[info.kind]})"
        )
    missing = [r for r in info.required if r not in kwargs]
    if missing:
        raise UserLossError(
            f"{where}: parameter {missing[0]!r} has no default and the spec does not set it; "
            f"write {where.rsplit('::', 1)[-1]}({missing[0]}=...)"
        )

"""Run a reference's pinned source from a git checkout or losslab's fetched cache.

The git directory is a checkout the user names (`--source owner/repo=PATH`, a work tree or a
bare git directory) or the cache `losslab.conformance.fetch` fetched the commit into. For a revision
`owner/repo@commit:path::function(...)` we read the file at that commit with `git show`, extract
the function plus the module-level definitions it uses with `ast` (following imports into other
files of the same repository at the same commit), and execute only those definitions, unchanged,
in a separate Python process (`sys.executable -I`, sockets disabled, a timeout), with the fixture
passed through a temporary JSON file. The framework adapter
(`losslab.conformance.frameworks.<name>.call_reference`) maps our per-datum layout to the
reference's. The extractor follows `from x import *`, drops function decorators (they register
or wrap) and binds the heavy/type-only modules of `STUB_MODULES` to inert stubs.

Only the extracted definitions of the pinned commit run; nothing from the source is written
anywhere except the temporary directory of one run (and the fetched objects in the cache).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.util
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from losslab.conformance.fixtures import Fixture
from losslab.conformance.frameworks import ReferenceResult, ResolvedReference, resolve_reference
from losslab.conformance.sandbox import INFERRED_BLOCKED_NOTE, blocked_from_gradients, run_isolated
from losslab.plan import Revision, RevisionError

RUNNER = Path(__file__).with_name("pinned_runner.py")
# Third-party/stdlib modules the runner may import for the reference (everything else must come
# from the repository itself).
RUNTIME_MODULES = frozenset(
    {
        "torch",
        "numpy",
        "math",
        "functools",
        "typing",
        "collections",
        "dataclasses",
        "itertools",
        "enum",
        "abc",
        "re",
        "operator",
        "__future__",
        "warnings",
        "contextlib",
        "types",
    }
)
# Heavy or type-only third-party modules a reference file imports at the top but whose use in
# the extracted definitions is incidental (logging, type checking, a registry's actor runtime):
# they are bound to an inert stub in the subprocess, and the extraction records each one, so a
# reference that really calls into one fails with the stub's error naming it.
STUB_MODULES = frozenset(
    {
        "ray",
        "omegaconf",
        "hydra",
        "loguru",
        "jaxtyping",
        "beartype",
        "typeguard",
        "pydantic",
        "tensordict",
        "transformers",
        "wandb",
        "cloudpickle",
    }
)


class PinnedSourceError(RuntimeError):
    """The pinned reference could not be obtained or run; the message names the revision."""


def parse_sources(items: Iterable[str]) -> dict[str, Path]:
    """Parse `--source owner/repo=PATH` options into {repo: path}."""
    out: dict[str, Path] = {}
    for item in items:
        repo, sep, path = item.partition("=")
        if not sep or repo.count("/") != 1 or not path:
            raise ValueError(
                f"--source {item!r}: expected owner/repo=PATH (a git checkout or "
                "bare git directory)"
            )
        p = Path(path).expanduser()
        if not p.exists():
            raise ValueError(f"--source {item!r}: {p} does not exist")
        if repo in out:
            raise ValueError(f"--source {repo} given twice")
        out[repo] = p
    return out


def _git(checkout: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, timeout=60, check=False
    )


class GitFiles:
    """Files of one commit of a checkout, read with `git show` (cached)."""

    def __init__(self, checkout: Path, revision: Revision) -> None:
        self.checkout, self.revision = checkout, revision
        self._cache: dict[str, str | None] = {}
        where = f"revision {revision.text!r}"
        probe = _git(checkout, "rev-parse", "--git-dir")
        if probe.returncode != 0:
            raise PinnedSourceError(
                f"{where}: {checkout} is not a git checkout or git directory "
                f"({probe.stderr.decode(errors='replace').strip()})"
            )
        found = _git(checkout, "rev-parse", "--verify", "--quiet", f"{revision.commit}^{{commit}}")
        if found.returncode != 0:
            raise PinnedSourceError(
                f"{where}: commit {revision.commit} does not exist in "
                f"{checkout} (git rev-parse found no such commit)"
            )
        self.commit = found.stdout.decode().strip()

    def read(self, path: str) -> str | None:
        """The file's text at the commit, None when the path is not in the commit's tree."""
        if path not in self._cache:
            res = _git(self.checkout, "show", f"{self.commit}:{path}")
            if res.returncode == 0:
                self._cache[path] = res.stdout.decode("utf-8")
            else:
                listed = _git(self.checkout, "ls-tree", "--name-only", self.commit, "--", path)
                if listed.returncode == 0 and listed.stdout.strip():
                    # in the tree but unreadable: a partial clone whose remote is unreachable
                    raise PinnedSourceError(
                        f"revision {self.revision.text!r}: {path} is in commit "
                        f"{self.commit[:12]} but its content cannot be read from "
                        f"{self.checkout} ({res.stderr.decode(errors='replace').strip()})"
                    )
                self._cache[path] = None
        return self._cache[path]

    def module_path(self, dotted: str) -> str | None:
        """The file of a dotted module in this repo (flat or src/ layout), or None."""
        stem = dotted.replace(".", "/")
        for candidate in (
            f"{stem}.py",
            f"{stem}/__init__.py",
            f"src/{stem}.py",
            f"src/{stem}/__init__.py",
        ):
            if self.read(candidate) is not None:
                return candidate
        return None


@dataclass
class ExtractedModule:
    """Top-level definitions taken, unchanged, from one file of the repository."""

    module: str
    path: str
    sha256: str
    imports: list[str] = field(default_factory=list)  # runtime import statements kept as written
    names: list[str] = field(default_factory=list)
    code: str = ""
    bindings: list[dict[str, Any]] = field(default_factory=list)  # names from other modules

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "path": self.path,
            "sha256": self.sha256,
            "imports": self.imports,
            "names": self.names,
            "code": self.code,
            "bindings": self.bindings,
        }


def _runtime_names(node: ast.AST) -> tuple[set[str], dict[str, set[str]]]:
    """Names a definition loads at run time and `alias.attr` uses. Annotations are excluded, and
    so are a function's decorators: the extracted function is executed undecorated (see
    `Extractor.finish`), so a registering decorator never pulls its registry in."""
    names: set[str] = set()
    attrs: dict[str, set[str]] = {}
    skip: set[int] = set()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for dec in node.decorator_list:
            skip.update(id(n) for n in ast.walk(dec))
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg) and sub.annotation is not None:
            skip.update(id(n) for n in ast.walk(sub.annotation))
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.returns is not None:
            skip.update(id(n) for n in ast.walk(sub.returns))
        if isinstance(sub, ast.AnnAssign):
            skip.update(id(n) for n in ast.walk(sub.annotation))
    for sub in ast.walk(node):
        if id(sub) in skip:
            continue
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            names.add(sub.id)
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            attrs.setdefault(sub.value.id, set()).add(sub.attr)
    return names, attrs


def _index(
    tree: ast.Module,
) -> tuple[dict[str, ast.stmt], dict[str, tuple[ast.stmt, str, str | None, int]]]:
    """Top-level definitions by name, and imported names -> (stmt, module, attr, level).
    `from m import *` statements are listed under the key "*<n>" (followed on demand)."""
    defs: dict[str, ast.stmt] = {}
    imports: dict[str, tuple[ast.stmt, str, str | None, int]] = {}
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    defs[target.id] = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            defs[stmt.target.id] = stmt
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    imports[alias.asname] = (stmt, alias.name, None, 0)
                else:  # `import a.b` binds `a`
                    top = alias.name.split(".")[0]
                    imports[top] = (stmt, top, None, 0)
        elif isinstance(stmt, ast.ImportFrom):
            if [a.name for a in stmt.names] == ["*"]:
                imports[f"*{len(imports)}"] = (stmt, stmt.module or "", "*", stmt.level)
                continue
            for alias in stmt.names:
                imports[alias.asname or alias.name] = (
                    stmt,
                    stmt.module or "",
                    alias.name,
                    stmt.level,
                )
    return defs, imports


class Extractor:
    """Collect a function and what it uses, across files of one commit."""

    def __init__(self, files: GitFiles, stub_names: Iterable[str] = ()) -> None:
        self.files = files
        # names an adapter declares type-only (e.g. verl's `AlgoConfig`, used in an isinstance
        # assert): bound to an empty class instead of being extracted
        self.stub_names = frozenset(stub_names)
        self.modules: dict[str, ExtractedModule] = {}
        self.order: list[str] = []
        self._trees: dict[str, tuple[ast.Module, str, dict, dict]] = {}
        self._wanted: dict[str, set[str]] = {}
        self._paths: dict[str, str] = {}

    def _fail(self, message: str) -> PinnedSourceError:
        return PinnedSourceError(f"revision {self.files.revision.text!r}: {message}")

    def _load(self, module: str, path: str) -> tuple[ast.Module, str, dict, dict]:
        self._paths[module] = path
        if module not in self._trees:
            text = self.files.read(path)
            if text is None:
                raise self._fail(f"file {path} does not exist at commit {self.files.commit}")
            try:
                tree = ast.parse(text)
            except SyntaxError as err:
                raise self._fail(
                    f"{path} at {self.files.commit[:8]} does not parse: {err}"
                ) from err
            defs, imports = _index(tree)
            self._trees[module] = (tree, text, defs, imports)
        return self._trees[module]

    def _resolve_module(self, module: str, level: int, here: str) -> str:
        """The absolute dotted name of `from <level dots><module> import ...` inside `here`
        (inside a package's `__init__.py`, one dot is the package itself)."""
        if level:
            is_package = self._paths.get(here, "").endswith("__init__.py")
            drop = level - 1 if is_package else level
            parts = here.split(".")
            base = parts[: len(parts) - drop] if drop <= len(parts) else []
            return ".".join([*base, module] if module else base)
        return module

    def want(self, module: str, path: str, names: Iterable[str], root: bool = False) -> None:
        """Mark `names` of `module` as needed, extracting their own dependencies."""
        tree, text, defs, imports = self._load(module, path)
        wanted = self._wanted.setdefault(module, set())
        if module not in self.modules:
            self.modules[module] = ExtractedModule(
                module, path, hashlib.sha256(text.encode("utf-8")).hexdigest()
            )
        queue = list(names)
        while queue:
            name = queue.pop()
            if name in wanted or name in dir(builtins):
                continue
            if name in self.stub_names and (name in imports or name not in defs):
                wanted.add(name)
                self.modules[module].bindings.append({"name": name, "kind": "stub_class"})
                continue
            if name in defs:
                wanted.add(name)
                used, attrs = _runtime_names(defs[name])
                queue.extend(n for n in used if n in defs or n in imports or n in self.stub_names)
                for alias, attr_names in attrs.items():
                    if alias in imports:
                        self._bind_import(module, path, alias, imports[alias], attr_names)
            elif name in imports:
                wanted.add(name)
                self._bind_import(module, path, name, imports[name], None)
            elif (star := self._star_origin(module, name)) is not None:
                wanted.add(name)  # `from .x import *` re-exports it
                star_module, star_path = star
                self.want(star_module, star_path, [name], root=True)
                self.modules[module].bindings.append(
                    {"name": name, "kind": "object", "module": star_module, "attr": name}
                )
            elif root:
                raise self._fail(
                    f"function {name} is not defined at the top level of {path} at "
                    f"commit {self.files.commit[:8]} (cannot extract it)"
                )
        if module not in self.order:
            self.order.append(module)

    def _star_origin(
        self, module: str, name: str, seen: frozenset[str] = frozenset()
    ) -> tuple[str, str] | None:
        """The (module, path) of this repository that `name` reaches `module` from through its
        `from x import *` statements (followed recursively), or None."""
        _, _, _, imports = self._trees[module]
        for key, (_, target, attr, level) in imports.items():
            if attr != "*" or not key.startswith("*"):
                continue
            dotted = self._resolve_module(target, level, module)
            path = self.files.module_path(dotted)
            if path is None or dotted in seen:
                continue
            _, _, defs, sub_imports = self._load(dotted, path)
            if name in defs or name in sub_imports:
                return dotted, path
            deeper = self._star_origin(dotted, name, seen | {module})
            if deeper is not None:
                return deeper
        return None

    def _bind_import(
        self,
        module: str,
        path: str,
        alias: str,
        entry: tuple[ast.stmt, str, str | None, int],
        attrs: set[str] | None,
    ) -> None:
        stmt, target, attr, level = entry
        ext = self.modules[module]
        target = self._resolve_module(target, level, module)
        top = target.split(".")[0]
        local = self.files.module_path(top) is not None or level > 0
        if not local and top in STUB_MODULES:
            if not any(b["name"] == alias for b in ext.bindings):
                ext.bindings.append({"name": alias, "kind": "stub", "module": target})
            return
        if not local:
            if top not in RUNTIME_MODULES or importlib.util.find_spec(top) is None:
                raise self._fail(
                    f"{path} needs '{ast.unparse(stmt)}' for {alias}, and {top} is "
                    f"neither in the repository, nor an allowed runtime module "
                    f"({', '.join(sorted(RUNTIME_MODULES))}), nor one losslab stubs "
                    f"({', '.join(sorted(STUB_MODULES))})"
                )
            line = ast.unparse(stmt)
            if line not in ext.imports:
                ext.imports.append(line)
            return
        if attr is not None:  # from pkg.mod import name  (name may be a submodule)
            sub = f"{target}.{attr}" if target else attr
            sub_path = self.files.module_path(sub)
            if sub_path is not None and attrs is not None:
                self.want(sub, sub_path, attrs)
                binding = {
                    "name": alias,
                    "kind": "namespace",
                    "module": sub,
                    "attrs": sorted(attrs),
                }
            else:
                mod_path = self.files.module_path(target)
                if mod_path is None:
                    raise self._fail(
                        f"{path} imports {attr} from {target}, which is not in the "
                        "repository at this commit"
                    )
                self.want(target, mod_path, [attr], root=True)
                binding = {"name": alias, "kind": "object", "module": target, "attr": attr}
                star = self._star_origin(target, attr)
                _, _, target_defs, target_imports = self._trees[target]
                if star is not None and attr not in target_defs and attr not in target_imports:
                    binding["module"] = star[0]
        else:  # import pkg.mod as alias -> a namespace of the attributes used
            mod_path = self.files.module_path(target)
            if mod_path is None:
                raise self._fail(
                    f"{path} imports {target}, which is not in the repository at this commit"
                )
            used = sorted(attrs or ())
            self.want(target, mod_path, used, root=True)
            binding = {"name": alias, "kind": "namespace", "module": target, "attrs": used}
        existing = [b for b in ext.bindings if b["name"] == alias]
        if existing and existing[0].get("kind") == "namespace" and binding["kind"] == "namespace":
            existing[0]["attrs"] = sorted(set(existing[0]["attrs"]) | set(binding["attrs"]))
        elif not existing:
            ext.bindings.append(binding)

    def finish(self) -> list[ExtractedModule]:
        """Fill each module's code with its wanted definitions, in source order."""
        out = []
        # dependencies were appended before their users finished, so `order` is dependency-first
        for module in self.order:
            tree, text, defs, imports = self._trees[module]
            wanted = self._wanted[module]
            ext = self.modules[module]
            segments, names = [], []
            for stmt in tree.body:
                own = [n for n, s in defs.items() if s is stmt and n in wanted]
                if own:
                    segment = ast.get_source_segment(text, stmt, padded=True)
                    if isinstance(stmt, ast.ClassDef) and stmt.decorator_list:
                        # class decorators (@dataclass) shape the class: kept
                        first = min(d.lineno for d in stmt.decorator_list)
                        segment = "\n".join(text.splitlines()[first - 1 : stmt.end_lineno])
                    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        # function decorators register or wrap (verl/SkyRL registries,
                        # torch.compile, jaxtyped): dropped, the function runs as written
                        segment = "\n".join(text.splitlines()[stmt.lineno - 1 : stmt.end_lineno])
                    segments.append(segment)
                    names.extend(own)
            ext.code = "\n\n\n".join(segments) + "\n"
            ext.names = names
            out.append(ext)
        return out


def extract(
    files: GitFiles,
    function: str,
    extra_roots: Iterable[str] = (),
    stub_names: Iterable[str] = (),
) -> list[ExtractedModule]:
    """Extract `function` (and optional extra roots present in the file) from the revision's path;
    `stub_names` are type-only names bound to empty classes instead of being extracted."""
    rev = files.revision
    module = rev.path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    module = module.removeprefix("src.")
    text = files.read(rev.path)
    if text is None:
        raise PinnedSourceError(
            f"revision {rev.text!r}: file {rev.path} does not exist at commit {files.commit}"
        )
    ex = Extractor(files, stub_names)
    _, _, defs, imports = ex._load(module, rev.path)
    # an extra root may be a name the file imports (slime's loss.py takes compute_policy_loss
    # from ppo_utils): wanted first, so its module is executed before the file that binds it
    imported = [r for r in extra_roots if r in imports and r not in defs]
    if imported:
        ex.want(module, rev.path, imported)
    ex.want(module, rev.path, [function], root=True)
    extra = [r for r in extra_roots if r in defs]
    if extra:
        ex.want(module, rev.path, extra)
    return ex.finish()


def run_pinned(
    ref: ResolvedReference, checkout: Path | GitFiles, fixture: Fixture, timeout_s: float = 120.0
) -> ReferenceResult:
    """Execute the pinned reference of `ref` from `checkout` on `fixture` in a subprocess.

    The revision is re-resolved against the checkout's commit, so parameters the revision leaves
    unset take the defaults of the framework's config classes at that commit (`result.resolved`).
    """
    rev = ref.revision
    fw = ref.framework
    files = checkout if isinstance(checkout, GitFiles) else GitFiles(checkout, rev)
    try:
        ref = resolve_reference(rev, files)
    except RevisionError as err:
        raise PinnedSourceError(str(err)) from err
    modules = extract(files, rev.function, fw.extra_roots, fw.stub_names)
    root_module = modules[-1].module if modules else ""
    for m in modules:
        if m.path == rev.path:
            root_module = m.module
    payload = {
        "modules": [m.to_dict() for m in modules],
        "root_module": root_module,
        "function": rev.function,
        "extra_roots": [r for r in fw.extra_roots if any(r in m.names for m in modules)],
        "framework": fw.name,
        "call_source": fw.call_source,
        "call_name": fw.call_reference.__name__,
        "params": ref.params,
        "revision_kwargs": rev.kwargs,
        "clip_bounds": rev.clip_bounds,
        "sequences": fixture.to_json_dict()["sequences"],
    }
    result = run_isolated(
        lambda inp, out: [sys.executable, "-I", str(RUNNER), str(inp), str(out)],
        payload,
        timeout_s=timeout_s,
        fail=lambda message: PinnedSourceError(f"revision {rev.text!r}: {message}"),
        who="pinned source",
        action="executing the extracted source",
        prefix="losslab-pinned-",
    )
    grads = [np.asarray(g, dtype=np.float32) for g in result["grad_D"]]
    blocked = blocked_from_gradients(fixture, grads)
    root = next(m for m in modules if m.path == rev.path)
    stubs = sorted(
        {
            f"{b['name']} ({b.get('module', 'type-only')})"
            for m in modules
            for b in m.bindings
            if b["kind"] in ("stub", "stub_class")
        }
    )
    where = files.checkout
    return ReferenceResult(
        loss=float(result["loss"]),
        per_sequence_loss=[float(x) for x in result["per_sequence_loss"]],
        grad_D=grads,
        blocked_D=blocked,
        source={
            "kind": "pinned_source",
            "repo": rev.repo,
            "obtained": getattr(files, "obtained", f"checkout {where}"),
            "label": f"pinned source executed: {rev.repo}@{files.commit}:{rev.path}::{rev.function} "
            f"from {where}",
            "checkout": str(where),
            "commit": files.commit,
            "file_sha256": root.sha256,
            "framework": fw.name,
            "extracted": {m.path: {"sha256": m.sha256, "names": m.names} for m in modules},
            "stubbed": stubs,
            "effective_params": ref.params,
            "notes": [*ref.notes, INFERRED_BLOCKED_NOTE],
            "native_metrics": result.get("native_metrics", {}),
        },
        dtype="float32",
        blocked_scope="nonzero_adv",
        resolved=ref,
    )

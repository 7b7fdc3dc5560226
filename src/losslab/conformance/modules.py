"""Module conformance: does an implementation of the objectives agree with a reference, function by
function, on held-out inputs?

`conform_modules(impl, reference)` calls every public function the two modules share on the cases
of `losslab.conformance.input_specs` (seeded random cases plus named edge cases) and compares:

- floating outputs with the function's tolerance (primitives atol 1e-6 / rtol 1e-5, the five
  composite objectives atol 1e-5 / rtol 1e-4; `|impl - ref| <= atol + rtol·|ref|`); NaN equals NaN
  and equal infinities agree; integer and bool outputs must be exactly equal;
- shapes and dtypes must match exactly, tuples/lists element by element;
- both raising the same exception type on an input counts as agreement; one raising while the other
  returns is a disagreement, whichever side raised. (The checker in the `reforacle` probe record
  counted a *reference* exception as a pass, so an implementation that returned garbage where the
  reference refused the input, or vice versa, went unnoticed; it also used atol 1e-5 / rtol 1e-4
  for every function, 10x looser than the graded primitive tolerance.)

A function passes only if it agrees on every case. The first failing case is kept with its inputs
printed as a Python expression and a one-line recipe that rebuilds it from its seed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch

from losslab.conformance.input_specs import INPUT_SPECS, Case, generate_cases

Status = Literal["pass", "fail", "no_spec"]
DEFAULT_CASES_PER_FUNCTION = 5


class ModuleLoadError(ValueError):
    """A module spec could not be imported or executed."""


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def load_module(spec: str) -> ModuleType:
    """Import `spec`: a dotted module path (`losslab.objectives`), a `.py` file, or a package
    directory holding `__init__.py`.

    A file or directory is *executed* (that is the caller's explicit request); it is registered in
    `sys.modules` under a name derived from its absolute path, so two files both called
    `objectives.py` do not collide.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModuleLoadError(f"module spec must be a module path or a .py file, got {spec!r}")
    path = Path(spec).expanduser()
    looks_like_path = spec.endswith(".py") or "/" in spec or "\\" in spec or path.exists()
    if not looks_like_path:
        try:
            return importlib.import_module(spec)
        except ImportError as exc:
            raise ModuleLoadError(f"cannot import module {spec!r}: {exc}") from exc
        except Exception as exc:
            raise ModuleLoadError(
                f"importing module {spec!r} raised {type(exc).__name__}: {exc}"
            ) from exc
    return _load_path(path, spec)


def _load_path(path: Path, spec: str) -> ModuleType:
    path = path.resolve()
    if path.is_dir():
        init = path / "__init__.py"
        if not init.is_file():
            raise ModuleLoadError(f"directory {spec!r} is not a package (no __init__.py)")
        file, search = init, [str(path)]
    elif path.is_file():
        if path.suffix != ".py":
            raise ModuleLoadError(f"file {spec!r} is not a .py file")
        file, search = path, None
    else:
        raise ModuleLoadError(f"no such file or directory: {spec!r}")
    tag = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"_losslab_conform_{path.stem if file is path else path.name}_{tag}"
    module_spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=search
    )
    if module_spec is None or module_spec.loader is None:  # pragma: no cover - .py files load
        raise ModuleLoadError(f"cannot load {spec!r} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and relative imports look the module up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ModuleLoadError(f"executing {spec!r} raised {type(exc).__name__}: {exc}") from exc
    return module


def public_functions(module: ModuleType) -> list[str]:
    """Names a module exports as functions: `__all__` when defined, else its public routines."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
        return sorted(n for n in names if inspect.isfunction(getattr(module, n)))
    return sorted(n for n in names if callable(getattr(module, n, None)))


# --------------------------------------------------------------------------------------------
# comparison
# --------------------------------------------------------------------------------------------


def _short(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor(shape={tuple(x.shape)}, dtype={x.dtype})"
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def _compare_tensors(
    a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, where: str
) -> str | None:
    if a.shape != b.shape:
        return f"{where}: shape {tuple(a.shape)} vs reference {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"{where}: dtype {a.dtype} vs reference {b.dtype}"
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        ok = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        rule = f"atol={atol:g}, rtol={rtol:g}"
    else:
        ok = a == b
        rule = "exact"
    if bool(ok.all()):
        return None
    bad = (~ok).reshape(-1)
    first = int(bad.nonzero()[0, 0])
    idx = _index(first, a.shape)
    av, bv = a.reshape(-1)[first].item(), b.reshape(-1)[first].item()
    detail = f"{int(bad.sum())}/{a.numel()} elements differ ({rule}); first at {idx}: {av!r} vs reference {bv!r}"
    if a.is_floating_point():
        both = torch.isfinite(a) & torch.isfinite(b)
        if bool(both.any()):
            err = float((a[both].double() - b[both].double()).abs().max())
            detail += f"; max abs err {err:.3g}"
    return f"{where}: {detail}"


def _compare_numbers(a: Any, b: Any, atol: float, rtol: float, where: str) -> str | None:
    if isinstance(a, float) or isinstance(b, float):
        fa, fb = float(a), float(b)
        if (math.isnan(fa) and math.isnan(fb)) or fa == fb or abs(fa - fb) <= atol + rtol * abs(fb):
            return None
        return f"{where}: {fa!r} vs reference {fb!r} (atol={atol:g}, rtol={rtol:g})"
    return None if a == b else f"{where}: {a!r} vs reference {b!r} (exact)"


def compare_outputs(
    out: Any, ref: Any, *, atol: float, rtol: float, where: str = "output"
) -> str | None:
    """None if `out` (implementation) agrees with `ref` (reference), else the first difference.

    Tensors: same shape and dtype, floats within `atol + rtol·|ref|` (NaN == NaN), other dtypes
    exact. Tuples/lists: same type and length, element by element. Python numbers: same type;
    floats within tolerance. Anything else: `==`.
    """
    if isinstance(out, torch.Tensor) or isinstance(ref, torch.Tensor):
        if not (isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor)):
            return f"{where}: returned {_short(out)} but reference returned {_short(ref)}"
        return _compare_tensors(out, ref, atol, rtol, where)
    if isinstance(out, tuple | list) or isinstance(ref, tuple | list):
        if type(out) is not type(ref) or len(out) != len(ref):
            return f"{where}: returned {_short(out)} but reference returned {_short(ref)}"
        for i, (o, r) in enumerate(zip(out, ref, strict=True)):
            diff = compare_outputs(o, r, atol=atol, rtol=rtol, where=f"{where}[{i}]")
            if diff is not None:
                return diff
        return None
    if type(out) is not type(ref):
        return f"{where}: returned {_short(out)} but reference returned {_short(ref)}"
    if isinstance(out, int | float | bool):
        return _compare_numbers(out, ref, atol, rtol, where)
    return None if out == ref else f"{where}: {_short(out)} vs reference {_short(ref)}"


@dataclass(frozen=True)
class _Outcome:
    value: Any = None
    error: BaseException | None = None

    def describe(self) -> str:
        if self.error is not None:
            msg = str(self.error).splitlines()[0] if str(self.error) else ""
            return f"raised {type(self.error).__name__}({msg[:120]!r})"
        return f"returned {_short(self.value)}"


def _call(fn: Callable[..., Any], case: Case) -> _Outcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. torch's "degrees of freedom <= 0" on n=1 std
        try:
            return _Outcome(value=fn(*case.clone_args()))
        except Exception as exc:  # noqa: BLE001 - any exception is an observable behaviour
            return _Outcome(error=exc)


def compare_case(
    impl_fn: Callable[..., Any], ref_fn: Callable[..., Any], case: Case, *, atol: float, rtol: float
) -> str | None:
    """Run both functions on `case` (fresh copies of the inputs each) and compare; None = agree."""
    out, ref = _call(impl_fn, case), _call(ref_fn, case)
    if out.error is not None or ref.error is not None:
        if out.error is not None and ref.error is not None:
            if type(out.error) is type(ref.error):
                return None
            return f"implementation {out.describe()}, reference {ref.describe()}"
        return f"implementation {out.describe()} but reference {ref.describe()}"
    return compare_outputs(out.value, ref.value, atol=atol, rtol=rtol)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseFailure:
    """The first input on which a function disagreed, printable and rebuildable from its seed."""

    label: str
    reason: str
    inputs: str
    reproduce: str
    why: str


@dataclass(frozen=True)
class FunctionResult:
    name: str
    status: Status
    kind: str  # "primitive", "composite", or "unknown" (no input spec)
    atol: float | None
    rtol: float | None
    cases_run: int
    cases_failed: int
    first_failure: CaseFailure | None = None


@dataclass(frozen=True)
class ConformanceResult:
    """Per-function outcome of `conform_modules`; `passed` needs >= 1 compared function."""

    impl: str
    reference: str
    seed: int
    cases_per_function: int
    functions: tuple[FunctionResult, ...]
    only_in_impl: tuple[str, ...]
    only_in_reference: tuple[str, ...]

    @property
    def compared(self) -> list[FunctionResult]:
        return [f for f in self.functions if f.status != "no_spec"]

    @property
    def failed(self) -> list[str]:
        return [f.name for f in self.functions if f.status == "fail"]

    @property
    def not_compared(self) -> list[str]:
        return [f.name for f in self.functions if f.status == "no_spec"]

    @property
    def passed(self) -> bool:
        return bool(self.compared) and not self.failed

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["failed"] = self.failed
        return out

    def summary(self) -> str:
        """A plain-text report: one line per function, details for each failure."""
        lines = [
            f"conform {self.impl} against reference {self.reference} "
            f"(seed={self.seed}, {self.cases_per_function} random cases per function + edge cases)"
        ]
        width = max((len(f.name) for f in self.functions), default=0)
        for f in self.functions:
            if f.status == "no_spec":
                lines.append(f"SKIP {f.name:<{width}}  no input spec: not compared")
                continue
            tol = f"{f.kind}, atol={f.atol:g} rtol={f.rtol:g}"
            if f.status == "pass":
                lines.append(f"PASS {f.name:<{width}}  {f.cases_run} cases ({tol})")
                continue
            ff = f.first_failure
            assert ff is not None
            lines.append(
                f"FAIL {f.name:<{width}}  {f.cases_failed}/{f.cases_run} cases disagree ({tol})"
            )
            lines.append(f"     first failing case: {ff.label} ({ff.why})")
            lines.append(f"     {ff.reason}")
            lines.append(f"     inputs: {ff.inputs}")
            lines.append(f"     reproduce: {ff.reproduce}")
        for side, names in (
            ("implementation", self.only_in_impl),
            ("reference", self.only_in_reference),
        ):
            if names:
                lines.append(f"only in the {side} (not compared): {', '.join(names)}")
        compared = self.compared
        verdict = f"{len(compared) - len(self.failed)}/{len(compared)} functions agree"
        if self.failed:
            verdict += f"; disagree: {', '.join(self.failed)}"
        if not compared:
            verdict = "no shared function with an input spec: nothing was compared"
        if self.not_compared:
            verdict += f"; not compared (no input spec): {', '.join(self.not_compared)}"
        lines.append(verdict)
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the check
# --------------------------------------------------------------------------------------------


def _as_module(module: ModuleType | str) -> tuple[ModuleType, str]:
    if isinstance(module, ModuleType):
        return module, module.__name__
    return load_module(module), module


def conform_function(
    name: str,
    impl_fn: Callable[..., Any],
    ref_fn: Callable[..., Any],
    *,
    seed: int = 0,
    cases_per_function: int = DEFAULT_CASES_PER_FUNCTION,
) -> FunctionResult:
    """Compare one function pair on its random and edge cases."""
    spec = INPUT_SPECS.get(name)
    if spec is None:
        return FunctionResult(name, "no_spec", "unknown", None, None, 0, 0)
    cases = generate_cases(name, seed=seed, cases_per_function=cases_per_function)
    first: CaseFailure | None = None
    failed = 0
    for case in cases:
        reason = compare_case(impl_fn, ref_fn, case, atol=spec.atol, rtol=spec.rtol)
        if reason is None:
            continue
        failed += 1
        if first is None:
            first = CaseFailure(case.label, reason, case.describe(), case.reproduce(), case.why)
    status: Status = "fail" if failed else "pass"
    return FunctionResult(name, status, spec.kind, spec.atol, spec.rtol, len(cases), failed, first)


def conform_modules(
    impl: ModuleType | str,
    reference: ModuleType | str,
    *,
    seed: int = 0,
    cases_per_function: int = DEFAULT_CASES_PER_FUNCTION,
    functions: Iterable[str] | None = None,
) -> ConformanceResult:
    """Compare every public function `impl` and `reference` share on held-out inputs.

    Args:
        impl: the implementation under test: a module, a dotted module path or a .py file path
            (a file is executed).
        reference: the module taken as ground truth, same forms as `impl`.
        seed: base seed; each case's generator is seeded from (seed, function, case label).
        cases_per_function: random cases per function, on top of its fixed edge cases.
        functions: restrict the check to these names (each must be defined in both modules).

    Returns:
        A `ConformanceResult`; `.passed` is False if any function disagrees or none was compared.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if (
        isinstance(cases_per_function, bool)
        or not isinstance(cases_per_function, int)
        or cases_per_function < 0
    ):
        raise ValueError(f"cases_per_function must be an int >= 0, got {cases_per_function!r}")
    impl_mod, impl_name = _as_module(impl)
    ref_mod, ref_name = _as_module(reference)
    impl_names, ref_names = set(public_functions(impl_mod)), set(public_functions(ref_mod))
    shared = sorted(impl_names & ref_names, key=_registry_order)
    if functions is not None:
        wanted = list(dict.fromkeys(functions))
        missing = [n for n in wanted if n not in impl_names or n not in ref_names]
        if missing:
            raise ValueError(
                f"functions: {', '.join(map(repr, missing))} not defined in both modules "
                f"(shared: {', '.join(shared) or 'none'})"
            )
        shared = sorted(wanted, key=_registry_order)
    results = tuple(
        conform_function(
            name,
            getattr(impl_mod, name),
            getattr(ref_mod, name),
            seed=seed,
            cases_per_function=cases_per_function,
        )
        for name in shared
    )
    return ConformanceResult(
        impl=impl_name,
        reference=ref_name,
        seed=seed,
        cases_per_function=cases_per_function,
        functions=results,
        only_in_impl=tuple(sorted(impl_names - ref_names)) if functions is None else (),
        only_in_reference=tuple(sorted(ref_names - impl_names)) if functions is None else (),
    )


_ORDER = {name: i for i, name in enumerate(INPUT_SPECS)}


def _registry_order(name: str) -> tuple[int, str]:
    """Registry (record) order first, then unknown names alphabetically."""
    return (_ORDER.get(name, len(_ORDER)), name)

"""Module conformance (`losslab conform`): the input-spec registry, the comparison rules, the CLI.

The end-to-end tests compare `losslab.objectives` with itself (must agree everywhere) and with
copies in which chosen functions follow a different convention (must fail on exactly those).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import losslab.objectives as objectives
from losslab.cli import app
from losslab.conformance.input_specs import (
    COMPOSITES,
    INPUT_SPECS,
    Case,
    case_labels,
    format_args,
    generate_case,
    generate_cases,
)
from losslab.conformance.modules import (
    ModuleLoadError,
    compare_case,
    compare_outputs,
    conform_modules,
    load_module,
    public_functions,
)

# The record lists the reference's 49 stubs as numbered source lines: "<n>\tdef name(...)".
RECORD_STUB = re.compile(r"^\d+\tdef ([A-Za-z_]\w*)\(", re.M)


def _module_with(**overrides: object) -> ModuleType:
    """losslab.objectives with some functions replaced (the rest are the real ones)."""
    mod = ModuleType("altered_objectives")
    for name in objectives.__all__:
        setattr(mod, name, getattr(objectives, name))
    for name, fn in overrides.items():
        setattr(mod, name, fn)
    return mod


# --------------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------------


def test_registry_keys_equal_the_records_49_names(shared_dir: Path) -> None:
    text = (shared_dir / "seeds" / "objectives_reverse_engineering_record.txt").read_text()
    names = set(RECORD_STUB.findall(text))
    assert len(names) == 49
    assert set(INPUT_SPECS) == names
    assert COMPOSITES == {
        "dpo_sequence_loss",
        "grpo_objective",
        "ppo_objective",
        "rloo_objective",
        "reverse_kl_objective",
    }
    for name, spec in INPUT_SPECS.items():
        # grading tolerances of the record: primitives 1e-6/1e-5, composites 1e-5/1e-4
        expected = (1e-5, 1e-4) if name in COMPOSITES else (1e-6, 1e-5)
        assert (spec.atol, spec.rtol) == expected, name


def test_registry_covers_the_package_exactly() -> None:
    assert set(INPUT_SPECS) == set(objectives.__all__)


@pytest.mark.parametrize("name", list(INPUT_SPECS))
def test_every_case_fits_the_signature_and_runs(name: str) -> None:
    """Inputs are valid: they bind to the real signature, and every case not marked may_raise
    runs on losslab.objectives and returns a tensor."""
    fn = getattr(objectives, name)
    signature = inspect.signature(fn)
    for case in generate_cases(name, seed=0, cases_per_function=3):
        signature.bind(*case.args)
        if case.may_raise:
            continue
        out = fn(*case.clone_args())
        assert isinstance(out, torch.Tensor), (name, case.label)


def test_each_function_has_edge_cases_beyond_random() -> None:
    for name, spec in INPUT_SPECS.items():
        assert len(spec.edges) >= 2, name
        assert len({e.label for e in spec.edges}) == len(spec.edges), name


def test_cases_are_seeded_and_independent() -> None:
    a = generate_cases("grpo_objective", seed=3, cases_per_function=4)
    b = generate_cases("grpo_objective", seed=3, cases_per_function=4)
    c = generate_cases("grpo_objective", seed=4, cases_per_function=4)
    assert [x.label for x in a] == [x.label for x in b]
    assert all(_same_args(x, y) for x, y in zip(a, b, strict=True))
    assert not _same_args(a[0], c[0])
    # fewer random cases leave the remaining random cases and all edge cases unchanged
    short = generate_cases("grpo_objective", seed=3, cases_per_function=2)
    kept = {x.label: x for x in a}
    assert all(_same_args(x, kept[x.label]) for x in short)
    assert case_labels("grpo_objective", 2)[:2] == ["random-0", "random-1"]


def _same_args(x: Case, y: Case) -> bool:
    if len(x.args) != len(y.args):
        return False
    for p, q in zip(x.args, y.args, strict=True):
        if isinstance(p, torch.Tensor):
            if not (isinstance(q, torch.Tensor) and p.dtype == q.dtype and torch.equal(p, q)):
                return False
        elif p != q:
            return False
    return True


def test_printed_inputs_rebuild_the_case_exactly() -> None:
    args = (
        torch.tensor([[0.1, float("nan")], [float("inf"), -float("inf")]]),
        torch.empty(0, 3),
        torch.tensor([1, -100]),
        torch.tensor([True, False]),
        0.25,
        "k3",
        None,
    )
    rebuilt = eval(format_args(args), {"torch": torch})
    assert torch.equal(rebuilt[0].nan_to_num(nan=7.0), args[0].nan_to_num(nan=7.0))
    assert rebuilt[1].shape == (0, 3) and rebuilt[1].dtype == torch.float32
    for i in (2, 3):
        assert rebuilt[i].dtype == args[i].dtype and torch.equal(rebuilt[i], args[i])
    assert rebuilt[4:] == (0.25, "k3", None)
    case = generate_case("dpo_sequence_loss", "random-1", seed=5)
    assert _same_args(Case("x", "y", 5, eval(case.describe(), {"torch": torch})), case)


def test_unknown_function_or_label_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no input spec for 'nope'"):
        generate_cases("nope")
    with pytest.raises(ValueError, match="'edge:nope' is not a case of whiten"):
        generate_case("whiten", "edge:nope")


# --------------------------------------------------------------------------------------------
# the comparison rules
# --------------------------------------------------------------------------------------------

_CASE = Case("f", "random-0", 0, (torch.tensor([1.0, 2.0]),))


def _raise(exc: type[Exception]):
    def fn(x: torch.Tensor) -> torch.Tensor:
        raise exc("refused")

    return fn


def _returns(value: object):
    return lambda x: value


def test_same_exception_type_agrees_and_different_types_disagree() -> None:
    assert compare_case(_raise(ValueError), _raise(ValueError), _CASE, atol=0, rtol=0) is None
    diff = compare_case(_raise(ValueError), _raise(RuntimeError), _CASE, atol=0, rtol=0)
    assert diff is not None and "ValueError" in diff and "RuntimeError" in diff


def test_one_side_raising_is_a_disagreement_either_way() -> None:
    # the record's checker returned True when the *reference* raised; here it is a failure
    ok = _returns(torch.tensor(1.0))
    diff = compare_case(ok, _raise(IndexError), _CASE, atol=1, rtol=1)
    assert diff is not None and "reference raised IndexError" in diff
    diff = compare_case(_raise(IndexError), ok, _CASE, atol=1, rtol=1)
    assert diff is not None and "implementation raised IndexError" in diff


def test_nan_equals_nan_but_not_a_number() -> None:
    nan = torch.tensor([float("nan"), 1.0])
    assert compare_outputs(nan, nan.clone(), atol=1e-6, rtol=1e-5) is None
    assert compare_outputs(torch.tensor([0.0, 1.0]), nan, atol=1e-6, rtol=1e-5) is not None
    inf = torch.tensor([-float("inf")])
    assert compare_outputs(inf, inf.clone(), atol=1e-6, rtol=1e-5) is None


def test_tolerance_is_per_kind() -> None:
    ref, out = torch.tensor([1.0]), torch.tensor([1.00002])
    # |out - ref| ≈ 2e-5 (float32 spacing at 1 is 1.2e-7): primitive bound 1e-6 + 1e-5·1 = 1.1e-5
    # is exceeded, composite bound 1e-5 + 1e-4·1 = 1.1e-4 is not
    assert compare_outputs(out, ref, atol=1e-6, rtol=1e-5) is not None
    assert compare_outputs(out, ref, atol=1e-5, rtol=1e-4) is None


def test_shape_dtype_and_type_must_match() -> None:
    x = torch.tensor([1.0, 2.0])
    assert "shape" in compare_outputs(x.view(1, 2), x, atol=1, rtol=1)
    assert "dtype" in compare_outputs(x.double(), x, atol=1, rtol=1)
    assert "reference returned" in compare_outputs(1.0, torch.tensor(1.0), atol=1, rtol=1)
    ints = torch.tensor([1, 2])
    assert "exact" in compare_outputs(torch.tensor([1, 3]), ints, atol=10, rtol=10)
    assert compare_outputs((x, ints), (x.clone(), ints.clone()), atol=0, rtol=0) is None
    assert "[1]" in compare_outputs((x, ints), (x, ints + 1), atol=0, rtol=0)


def test_inputs_are_copied_per_call() -> None:
    def mutating(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x

    # if the reference saw the implementation's in-place edit, both would return [2, 4]
    diff = compare_case(mutating, lambda x: x, _CASE, atol=0, rtol=0)
    assert diff is not None and "2.0 vs reference 1.0" in diff
    assert torch.equal(_CASE.args[0], torch.tensor([1.0, 2.0]))


def test_nothing_compared_is_not_a_pass() -> None:
    a, b = ModuleType("a"), ModuleType("b")
    a.helper = b.helper = lambda x: x  # shared, but no input spec
    result = conform_modules(a, b)
    assert not result.passed
    assert result.not_compared == ["helper"]
    assert "nothing was compared" in result.summary()


def test_functions_filter_and_unshared_names() -> None:
    impl = _module_with(extra=lambda x: x)
    result = conform_modules(impl, objectives, functions=["whiten", "gae"])
    assert [f.name for f in result.functions] == ["gae", "whiten"]  # registry order
    assert result.passed
    full = conform_modules(impl, objectives, functions=None, cases_per_function=0)
    assert full.only_in_impl == ("extra",) and full.only_in_reference == ()
    with pytest.raises(ValueError, match="'extra' not defined in both modules"):
        conform_modules(impl, objectives, functions=["extra"])


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def test_load_module_paths_and_errors(tmp_path: Path) -> None:
    assert load_module("losslab.objectives") is objectives
    one, two = tmp_path / "a" / "objectives.py", tmp_path / "b" / "objectives.py"
    for i, path in enumerate((one, two)):
        path.parent.mkdir()
        path.write_text(f"def value():\n    return {i}\n")
    m1, m2 = load_module(str(one)), load_module(str(two))
    assert (m1.value(), m2.value()) == (0, 1)  # same file name, distinct modules
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .inner import f\n")
    (pkg / "inner.py").write_text("def f():\n    return 'inner'\n")
    assert load_module(str(pkg)).f() == "inner"
    with pytest.raises(ModuleLoadError, match="no such file"):
        load_module(str(tmp_path / "missing.py"))
    with pytest.raises(ModuleLoadError, match="cannot import module 'no_such_mod_xyz'"):
        load_module("no_such_mod_xyz")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ModuleLoadError, match="executing .*bad.py.* RuntimeError: boom"):
        load_module(str(bad))


def test_public_functions_uses___all___or_public_functions() -> None:
    assert public_functions(objectives) == sorted(objectives.__all__)
    mod = ModuleType("m")
    mod.f = lambda: 1
    mod._g = lambda: 2
    mod.torch = torch
    mod.Tensor = torch.Tensor
    assert public_functions(mod) == ["f"]


# --------------------------------------------------------------------------------------------
# end to end: self-conformance and altered copies
# --------------------------------------------------------------------------------------------

_ALTERED_SOURCE = textwrap.dedent(
    '''
    """losslab.objectives with three functions following another convention."""
    import torch

    import losslab.objectives as _base

    globals().update({n: getattr(_base, n) for n in dir(_base) if not n.startswith("_")})


    def whiten(values, mask, shift_mean):
        # Bessel-corrected (TRL) variance instead of the reference's biased one
        mean = (values * mask).sum() / mask.sum()
        var = ((values - mean) ** 2 * mask).sum() / (mask.sum() - 1)
        white = (values - mean) * torch.rsqrt(var + 1e-8)
        return white if shift_mean else white + mean


    def bucketize_reward(rewards, boundaries):
        return torch.bucketize(rewards, boundaries, right=False)  # torch default


    def mode_label(labels):
        return torch.mode(labels.flatten()).values  # ties go to the smallest value
    '''
)
ALTERED = {"whiten", "bucketize_reward", "mode_label"}


@pytest.fixture
def altered_file(tmp_path: Path) -> Path:
    path = tmp_path / "altered_objectives.py"
    path.write_text(_ALTERED_SOURCE)
    return path


def test_cli_self_conformance_passes() -> None:
    result = CliRunner().invoke(
        app, ["conform", "losslab.objectives", "--reference", "losslab.objectives"]
    )
    assert result.exit_code == 0, result.output
    assert "49/49 functions agree" in result.output
    assert "FAIL" not in result.output


def test_api_self_conformance_covers_all_49() -> None:
    result = conform_modules("losslab.objectives", "losslab.objectives", seed=1)
    assert result.passed
    assert len(result.compared) == 49 and not result.not_compared
    assert all(f.cases_run >= 5 + 2 for f in result.functions)  # 5 random + >= 2 edge cases


def test_altered_copy_fails_on_exactly_the_altered_functions(
    altered_file: Path, tmp_path: Path
) -> None:
    out_json = tmp_path / "conform.json"
    cli = CliRunner().invoke(
        app,
        ["conform", str(altered_file), "-r", "losslab.objectives", "--json", str(out_json)],
    )
    assert cli.exit_code == 1, cli.output
    failing = set(re.findall(r"^FAIL (\w+)", cli.output, re.M))
    assert failing == ALTERED
    assert "46/49 functions agree" in cli.output
    saved = json.loads(out_json.read_text())
    assert set(saved["failed"]) == ALTERED and saved["passed"] is False

    result = conform_modules(load_module(str(altered_file)), objectives)
    assert set(result.failed) == ALTERED
    # the first failing input of each altered function is printable and reproducible
    altered = load_module(str(altered_file))
    for f in result.functions:
        if f.name not in ALTERED:
            continue
        ff = f.first_failure
        assert ff is not None
        case = generate_case(f.name, ff.label, seed=0)
        assert _same_args(Case(f.name, ff.label, 0, eval(ff.inputs, {"torch": torch})), case)
        spec = INPUT_SPECS[f.name]
        impl_fn, ref_fn = getattr(altered, f.name), getattr(objectives, f.name)
        assert compare_case(impl_fn, ref_fn, case, atol=spec.atol, rtol=spec.rtol) == ff.reason


def test_cli_reports_unloadable_module() -> None:
    result = CliRunner().invoke(app, ["conform", "no_such_mod_xyz", "-r", "losslab.objectives"])
    assert result.exit_code == 2
    assert "cannot import module 'no_such_mod_xyz'" in result.output


# One alternative convention per function, each one the record or its peers (TRL, verl, torch
# defaults) plausibly use; the registry's edge cases must separate every one from the package.


def _masked_mean_nan(values, mask, axis=None):
    num = (values * mask).sum() if axis is None else (values * mask).sum(dim=axis)
    den = mask.sum() if axis is None else mask.sum(dim=axis)
    return num / den  # empty mask -> NaN (TRL/OpenRLHF) instead of 0


def _masked_max_product(values, mask):
    return (values * mask).max()  # masked slots become 0 instead of being excluded


def _gae_time_last(rewards, values, next_value, gamma, lam):
    adv, last = torch.zeros_like(rewards), torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        v_next = values[..., t + 1] if t + 1 < rewards.shape[-1] else next_value
        last = rewards[..., t] + gamma * v_next - values[..., t] + gamma * lam * last
        adv[..., t] = last
    return adv  # time on the last dim (TRL/verl layout)


def _discounted_time_last(rewards, gamma):
    out, run = torch.zeros_like(rewards), torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        run = rewards[..., t] + gamma * run
        out[..., t] = run
    return out


def _grpo_unbiased(rewards, group_size, scale_by_std):
    r = rewards.reshape(-1, group_size)
    adv = r - r.mean(dim=1, keepdim=True)
    if scale_by_std:
        adv = adv / (r.std(dim=1, keepdim=True) + 1e-6)  # verl: unbiased std
    return adv.reshape(rewards.shape)


def _normalize_eps_inside(x, eps):
    return (x - x.mean()) / torch.sqrt(x.var() + eps)


def _whiten_eps_outside(values, mask, shift_mean):
    mean = (values * mask).sum() / mask.sum()
    std = (((values - mean) ** 2 * mask).sum() / mask.sum()).sqrt()
    white = (values - mean) / (std + 1e-8)
    return white if shift_mean else white + mean


def _quantile_nearest_rank(x, q):
    s = torch.sort(x.flatten()).values
    return s[max(0, math.ceil(q * s.numel()) - 1)]


def _top_p_hf(probs, p):
    sorted_p, idx = torch.sort(probs, dim=-1)  # ascending, as HF TopPLogitsWarper
    remove = sorted_p.cumsum(-1) <= 1 - p
    remove[..., -1] = False
    kept = torch.zeros_like(probs).scatter(-1, idx, sorted_p.masked_fill(remove, 0.0))
    return kept / kept.sum(-1, keepdim=True)


def _kl_verl_clamp(logp, ref_logp, estimator):
    d = (logp - ref_logp).clamp(-20, 20)
    if estimator == "k3":
        return (torch.exp(-d) - 1 + d).clamp(-10, 10)
    return objectives.kl_penalty(logp, ref_logp, estimator)


def _pg_dual_clip(logp, old_logp, advantages, mask, clip_low, clip_high):
    ratio = torch.exp(logp - old_logp)
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
    pg = torch.where(advantages < 0, torch.min(pg, -advantages * 3.0), pg)  # verl dual-clip c=3
    return (pg * mask).sum() / mask.sum().clamp(min=1)


def _clip_fraction_ge(logp, old_logp, clip):
    return ((torch.exp(logp - old_logp) - 1).abs() >= clip).float().mean()


ALTERNATIVES = {
    "masked_mean": _masked_mean_nan,
    "masked_max": _masked_max_product,
    "gae": _gae_time_last,
    "discounted_returns": _discounted_time_last,
    "grpo_advantages": _grpo_unbiased,
    "normalize": _normalize_eps_inside,
    "whiten": _whiten_eps_outside,
    "quantile_lower": _quantile_nearest_rank,
    "top_p_mask": _top_p_hf,
    "kl_penalty": _kl_verl_clamp,
    "clipped_pg_loss": _pg_dual_clip,
    "clip_fraction": _clip_fraction_ge,
    "huber_value_loss": lambda v, r, delta: F.smooth_l1_loss(v, r, beta=delta),
    "bucketize_reward": lambda r, b: torch.bucketize(r, b),
    "mode_label": lambda labels: torch.mode(labels.flatten()).values,
    "median_reward": lambda r: torch.median(r),
    "cumulative_max": lambda x: torch.cummax(x, dim=0).values,  # inclusive, not shifted
}


@pytest.mark.parametrize("name", sorted(ALTERNATIVES))
def test_alternative_convention_is_caught(name: str) -> None:
    impl = _module_with(**{name: ALTERNATIVES[name]})
    result = conform_modules(impl, objectives, functions=[name], cases_per_function=3)
    assert result.failed == [name], result.summary()

"""A plan fuzzer: generated mutants of the seed plans, each rejected at its JSON path or rightly
accepted, with no exception escaping `check_plan_data` / `check_plan_file`.

Seeds: the user's plan (/work/shared/seeds/experiment_plan.json, when the shared folder is there)
and every examples/*.json. Mutants come from `random.Random(FUZZ_SEED)`, so the set is the same
on every run. Each family carries its own oracle:

- non-finite: NaN/Infinity at a numeric leaf -> an error at exactly that path (JSON has neither).
- out-of-domain: a value outside the field's domain (table `DOMAIN`) -> an error at that path.
- wrong-type: a leaf of a typed field replaced by another JSON type -> an error at that path or
  below it; a free-form field (`FREE_FORM`) may accept it.
- bad-loss: a registry spec `losslab.losses` refuses -> an error at that arm's loss.
- good-loss: a valid spec for the baseline arm -> accepted (arms still differ only in the loss).
- deep: a value nested past `MAX_DEPTH` -> refused at `$`, also through the file path.
- delete: any field removed -> a plan or problems, never an exception.
"""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from losslab.plan import check_plan_data, check_plan_file
from losslab.plan.semantics import MAX_DEPTH

REPO = Path(__file__).resolve().parents[2]
SHARED_SEED = REPO.parent / "shared" / "seeds" / "experiment_plan.json"
FUZZ_SEED = 20261201
MUTANTS_PER_SEED_PLAN = 160

SEED_PLANS = sorted(REPO.glob("examples/*.json")) + ([SHARED_SEED] if SHARED_SEED.is_file() else [])

# field -> values outside its domain (each must be refused at that field's path)
DOMAIN: dict[str, list[Any]] = {
    "optimizer.lr": [0, -1e-5, 1e300, 2.0],
    "arms[*].lr": [0.0, -3e-5, 1e300, 5.0],
    "optimizer.beta1": [1.0, -0.1, 1.5],
    "optimizer.beta2": [1.0, -1e-9],
    "optimizer.eps": [0.0, -1e-8],
    "optimizer.weight_decay": [-0.01, 2.0],
    "lora_rank": [0, -1, 10**30, 1025],
    "steps": [0, -5, 10**12],
    "batch_size": [0, -8],
    "max_seq_len": [0, 10**12],
    "eval.n_examples": [0, 10**9],
    "arms[*].seed": [-1, 2**64],
    "arms[*].updates_per_batch": [0, -2],
    "decision_rule.alpha": [0, 1, 1.5, -0.05],
    "decision_rule.criteria[0].margin": [-1, 1, -2.5, 7],
    "correctness_preflight.paths[0].tolerances.baseline_loss.atol": [-1e-6],
    "correctness_preflight.paths[0].tolerances.reference_gradient.rtol": [-0.5],
    "activation_gate.checks[0].min": [-0.5, 1.5],
    "budget.gpu_hours": [0, -1],
    "engine.group_size": [0, 10**7],
    "engine.max_tokens": [0, 10**9],
}

BAD_LOSSES = [
    "ppo(foo=1)",
    "ppo(clip_low_threshold=1.5, clip_high_threshold=0.5)",
    "dppo_binary_tv(low=inf)",
    "dppo_binary_kl(high=-0.2)",
    "cispo(clip_low_threshold=nan)",
    "ppo(reduction=bogus)",
    "dppo_binary_tv(anchor='elsewhere')",
    "ppo(clip_ratio_c=0)",
]
GOOD_BASELINE_LOSSES = [
    "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)",
    "ppo(clip_low_threshold=0.7, clip_high_threshold=1.3, reduction='sum')",
    "grpo_clip_eps0.2",
]

FREE_FORM = ("feasibility", "feasibility_check.phases", "engine.task_config")
"""Fields typed `Any`/`dict[str, Any]`: any JSON value there is rightly accepted."""
FREE_LISTS = ("activation_gate.checks[*].one_of",)


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, f"{prefix}[{i}]")
    else:
        out.append((prefix, node))
    return out


def _parts(path: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in path.replace("]", "").split("."):
        name, *idx = piece.split("[")
        if name:
            parts.append(name)
        parts += [int(i) for i in idx]
    return parts


def _exists(data: Any, path: str) -> bool:
    node = data
    for part in _parts(path):
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return False
        elif not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _set(data: Any, path: str, value: Any, *, delete: bool = False) -> None:
    *head, last = _parts(path)
    node = data
    for part in head:
        node = node[part]
    if delete:
        del node[last]
    else:
        node[last] = value


def _generic(path: str) -> str:
    """`arms[1].lr` -> `arms[*].lr` (for the tables above)."""
    out, depth = [], 0
    for ch in path:
        if ch == "[":
            depth += 1
            out.append("[*]")
        elif ch == "]":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _free(path: str) -> bool:
    generic = _generic(path)
    return any(path.startswith(f) for f in FREE_FORM) or any(
        generic.startswith(f) for f in FREE_LISTS
    )


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _wrong_type(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return rng.choice(["true", 1, [True]])
    if isinstance(value, int | float):
        return rng.choice([str(value), [value], {"v": value}, True])
    if isinstance(value, str):
        return rng.choice([1, [value], {"s": value}, False])
    if value is None:
        return rng.choice([[1, 2], {"x": 1}])
    return 1


def _mutants(seed_path: Path, rng: random.Random) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """(family, path, value, mutant plan) for one seed plan."""
    base = _load(seed_path)
    leaves = [(p, v) for p, v in _leaves(base) if p]
    numeric = [(p, v) for p, v in leaves if isinstance(v, int | float) and not isinstance(v, bool)]
    out = []
    families = ["non-finite", "domain", "wrong-type", "bad-loss", "good-loss", "deep", "delete"]
    while len(out) < MUTANTS_PER_SEED_PLAN:
        family = families[len(out) % len(families)]
        data = copy.deepcopy(base)
        if family == "non-finite" and numeric:
            path, _ = rng.choice(numeric)
            value = rng.choice([math.nan, math.inf, -math.inf])
        elif family == "domain":
            generic = rng.choice(sorted(DOMAIN))
            concrete = [p for p, _ in leaves if _generic(p) == generic] or (
                [generic] if "*" not in generic and _exists(base, generic.rsplit(".", 1)[0]) else []
            )
            if not concrete:
                continue
            path, value = rng.choice(concrete), rng.choice(DOMAIN[generic])
        elif family == "wrong-type":
            path, old = rng.choice(leaves)
            value = _wrong_type(old, rng)
        elif family == "bad-loss":
            path, value = f"arms[{rng.randrange(2)}].loss", rng.choice(BAD_LOSSES)
        elif family == "good-loss":
            path, value = "arms[0].loss", rng.choice(GOOD_BASELINE_LOSSES)
        elif family == "deep":
            path, _ = rng.choice(leaves)
            value = _deep(rng.choice([MAX_DEPTH + 1, 200, 1200, 5000]))
        else:
            path, value = rng.choice(leaves), None
            path = path[0]
            _set(data, path, None, delete=True)
            out.append((family, path, value, data))
            continue
        _set(data, path, value)
        out.append((family, path, value, data))
    return out


def _all_mutants() -> list[tuple[str, str, str, Any, dict[str, Any]]]:
    rng = random.Random(FUZZ_SEED)
    return [(s.name, *m) for s in SEED_PLANS for m in _mutants(s, rng)]


MUTANTS = _all_mutants()


def _under(error_path: str, path: str) -> bool:
    return error_path == path or error_path.startswith((path + ".", path + "["))


def test_the_fuzzer_makes_at_least_300_mutants_from_every_seed_plan() -> None:
    assert len(SEED_PLANS) >= 2 and len(MUTANTS) >= 300
    assert {m[0] for m in MUTANTS} == {p.name for p in SEED_PLANS}
    assert len({m[1] for m in MUTANTS}) == 7  # every family is exercised


def test_every_mutant_is_rejected_at_its_path_or_rightly_accepted() -> None:
    wrong: list[str] = []
    for seed, family, path, value, data in MUTANTS:
        # examples/ holds the seed plans and the loss files they name (my_dppo_plan.json)
        result = check_plan_data(data, base_dir=REPO / "examples")  # must not raise
        assert result.ok == (result.plan is not None)
        for problem in result.errors:
            assert problem.path and problem.message and "\n" not in problem.message
        paths = [p.path for p in result.errors]
        shown = json.dumps(value)[:60] if family != "deep" else "(deep)"
        where = f"{seed} {family} {path}={shown}: {[str(e) for e in result.errors][:3]}"
        if family in ("non-finite", "domain", "bad-loss"):
            if path not in paths:
                wrong.append(f"not rejected at its path: {where}")
        elif family == "wrong-type":
            if not _free(path) and not any(_under(p, path) for p in paths):
                wrong.append(f"wrong type not rejected at its path: {where}")
        elif family == "good-loss":
            if not result.ok:
                wrong.append(f"valid baseline loss rejected: {where}")
        elif family == "deep":
            if paths != ["$"]:
                wrong.append(f"deep nesting not refused at $: {where}")
    assert not wrong, "\n".join(wrong[:20])


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1200, 100_000])
def test_deep_nesting_in_a_file_is_one_clear_problem(tmp_path: Path, depth: int) -> None:
    plan = _load(SEED_PLANS[0])
    text = json.dumps(plan)[:-1] + ', "feasibility": ' + "[" * depth + "]" * depth + "}"
    path = tmp_path / "deep.json"
    path.write_text(text)
    result = check_plan_file(path)
    assert [p.path for p in result.errors] == ["$"]
    assert f"nesting is {depth + 1} levels deep" in result.errors[0].message

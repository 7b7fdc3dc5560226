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

Hostile families (issue 25), each a kind of plan that was wrongly accepted before:

- unsafe-name: an arm name that is not one plain file name (traversal, absolute, separator, NUL,
  dot name, over-long, ...) -> an error at that arm's name.
- safe-name: both arms renamed to random safe names (references renamed with them) -> accepted.
- bad-backend: `engine.backend` not in `backends.registry.BACKENDS` -> an error there.
- non-rl-loss: `cross_entropy` as an arm's loss -> an error at that arm's loss.
- bad-string: a NUL, control character or lone surrogate inserted into any string value ->
  an error at exactly that string's path.
- empty-text: title, hypothesis or base_model empty or blank -> an error there.
- bad-revision: a revision with a NUL, a `..` or absolute path, a NaN/non-number/half clip
  pin -> an error at that revision.
- float-extreme: alpha whose 1 - alpha rounds to 1, weights whose range leaves the floating
  point range -> an error at the rule's alpha or under the criterion's weights.
- dup-key: a key repeated in any object of the JSON text -> an error at that key's path.
- secret: the value of TINKER_API_KEY, encoded, in any string value -> an error at that path,
  and no message shows the value.

Every message of every mutant is also checked to be printable as UTF-8 and free of the key.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import random
import string
import time
from pathlib import Path
from typing import Any

import pytest

from losslab.backends.registry import BACKENDS
from losslab.plan import check_plan_data, check_plan_file, check_plan_text
from losslab.plan.names import MAX_NAME_CHARS
from losslab.plan.semantics import MAX_DEPTH

REPO = Path(__file__).resolve().parents[2]
SHARED_SEED = REPO.parent / "shared" / "seeds" / "experiment_plan.json"
FUZZ_SEED = 20261201
MUTANTS_PER_SEED_PLAN = 272  # 17 families x 16: 544 mutants from the two examples alone
SECRET = "tml-fuzz0123456789abcdefXYZ"  # TINKER_API_KEY while the mutants are checked

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


UNSAFE_NAMES = [
    "../../../victim_data/train",
    "..",
    ".",
    ".hidden",
    "/etc/passwd",
    "a/b",
    "a\\b",
    "C:\\x",
    "arm\x00",
    "",
    " ",
    "-rf",
    "_x",
    "arm name",
    "caf\u00e9",
    "arm\u2215x",
    "x" * (MAX_NAME_CHARS + 1),
    "a\nb",
    "~",
    "$HOME",
]

BAD_STRING_INSERTS = ["\x00", "\x1b", "\x07", "\x7f", "\ud800", "\udfff", "\udbff"]


def _bad_revisions(text: str, baseline: bool) -> list[str]:
    """Mutants of a revision string that plan check must refuse."""
    path_start = text.index(":", text.index("@")) + 1
    out = [
        text[:path_start] + "../" + text[path_start:],
        text[:path_start] + "/" + text[path_start:],
        text[:path_start] + "a//" + text[path_start:],
        text.replace("::", "\x00::", 1),
        text + "\x00",
    ]
    if baseline:
        call = text.index("(", text.index("::"))
        for pin in (
            "clip nan/nan",
            "clip a/b",
            "clip_ratio=nan",
            "clip_ratio='x'",
            "clip_low_threshold=0.8",
            "clip 1.5/0.5",
            "clip_ratio=inf",
        ):
            out.append(text[: call + 1] + pin + ")")
    return out


def _string_leaves(leaves: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(p, v) for p, v in leaves if isinstance(v, str)]


def _rename_arms(data: dict[str, Any], rng: random.Random) -> list[str]:
    """Both arms renamed to distinct random safe names, every reference to them too."""
    alphabet = string.ascii_letters + string.digits + "_.-"
    new: list[str] = []
    while len(new) < 2:
        length = rng.randint(1, MAX_NAME_CHARS)
        name = rng.choice(string.ascii_letters + string.digits) + "".join(
            rng.choice(alphabet) for _ in range(length - 1)
        )
        if name.casefold() not in {n.casefold() for n in new}:
            new.append(name)
    old = [a["name"] for a in data["arms"]]
    mapping = dict(zip(old, new, strict=True))
    for arm, name in zip(data["arms"], new, strict=True):
        arm["name"] = name
    for group in (data.get("restoration_preflight") or {}).get("groups", []):
        for r_arm in group.get("arms", []):
            r_arm["name"] = mapping.get(r_arm["name"], r_arm["name"])
    for crit in data["decision_rule"]["criteria"]:
        crit["weights"] = {mapping.get(k, k): w for k, w in crit["weights"].items()}
    return new


def _objects(node: Any, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(path, object) for every non-empty object of the JSON tree."""
    out = [(prefix or "$", node)] if isinstance(node, dict) and node else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _objects(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _objects(v, f"{prefix}[{i}]")
    return out


def _dump_with_duplicate(node: Any, target: dict[str, Any], key: str, first: Any) -> str:
    """JSON text of `node` where object `target` holds `key` twice: `first`, then its value."""
    if isinstance(node, dict):
        items = [
            f"{json.dumps(k)}: {_dump_with_duplicate(v, target, key, first)}"
            for k, v in node.items()
        ]
        if node is target:
            items.insert(0, f"{json.dumps(key)}: {json.dumps(first)}")
        return "{" + ", ".join(items) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(_dump_with_duplicate(v, target, key, first) for v in node) + "]"
    return json.dumps(node)


SECRET_ENCODINGS = [
    lambda s: s,
    lambda s: "".join(f"\\u{ord(c):04x}" for c in s),  # in the decoded string: \u0074...
    lambda s: "".join(f"%{b:02X}" for b in s.encode()),
    lambda s: s.encode().hex(),
    lambda s: base64.b64encode(b"Authorization: " + s.encode()).decode(),
    lambda s: "&#116;" + s[1:],
]


def _mutants(seed_path: Path, rng: random.Random) -> list[tuple[str, str, Any, dict[str, Any]]]:
    """(family, path, value, mutant plan) for one seed plan."""
    base = _load(seed_path)
    leaves = [(p, v) for p, v in _leaves(base) if p]
    numeric = [(p, v) for p, v in leaves if isinstance(v, int | float) and not isinstance(v, bool)]
    out = []
    strings = _string_leaves(leaves)
    revisions = [
        (f"correctness_preflight.paths[{j}].{key}", path[key])
        for j, path in enumerate((base.get("correctness_preflight") or {}).get("paths", []))
        for key in ("baseline_revision", "reference_revision")
        if isinstance(path.get(key), str)
    ]
    out = []
    while len(out) < MUTANTS_PER_SEED_PLAN:
        family = FAMILIES[len(out) % len(FAMILIES)]
        data = copy.deepcopy(base)
        if family in HOSTILE:
            mutant = _hostile(family, data, base, strings, revisions, rng)
            if mutant is not None:
                out.append((family, *mutant, data))
            continue
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


FAMILIES = ["non-finite", "domain", "wrong-type", "bad-loss", "good-loss", "deep", "delete"]
HOSTILE = [
    "unsafe-name",
    "safe-name",
    "bad-backend",
    "non-rl-loss",
    "bad-string",
    "empty-text",
    "bad-revision",
    "float-extreme",
    "dup-key",
    "secret",
]
FAMILIES += HOSTILE


def _hostile(
    family: str,
    data: dict[str, Any],
    base: dict[str, Any],
    strings: list[tuple[str, str]],
    revisions: list[tuple[str, str]],
    rng: random.Random,
) -> tuple[str, Any] | None:
    """Apply one hostile mutation to `data`: (expected error path, value), None to draw again.
    For `dup-key` the value is the plan's JSON text (checked with `check_plan_text`)."""
    if family == "unsafe-name":
        i = rng.randrange(2)
        value = rng.choice(UNSAFE_NAMES)
        data["arms"][i]["name"] = value
        return f"arms[{i}].name", value
    if family == "safe-name":
        return "arms", _rename_arms(data, rng)
    if family == "bad-backend":
        value = rng.choice(["nosuch", "Local", "local ", "tinker2", "", "../local", "torch"])
        assert value not in BACKENDS
        data.setdefault("engine", {})["backend"] = value
        return "engine.backend", value
    if family == "non-rl-loss":
        i = rng.randrange(2)
        value = rng.choice(["cross_entropy", "cross_entropy()", "cross_entropy(reduction='sum')"])
        data["arms"][i]["loss"] = value
        return f"arms[{i}].loss", value
    if family == "bad-string":
        path, old = rng.choice(strings)
        at = rng.randint(0, len(old))
        value = old[:at] + rng.choice(BAD_STRING_INSERTS) + old[at:]
        _set(data, path, value)
        return path, value
    if family == "empty-text":
        path = rng.choice(["title", "hypothesis", "base_model"])
        value = rng.choice(["", " ", "\t\n", "   "])
        data[path] = value
        return path, value
    if family == "bad-revision":
        if not revisions:
            return None
        path, text = rng.choice(revisions)
        value = rng.choice(_bad_revisions(text, path.endswith("baseline_revision")))
        _set(data, path, value)
        return path, value
    if family == "float-extreme":
        rule = data["decision_rule"]
        crit = rule["criteria"][0]
        kind = rng.choice(["alpha", "huge", "tiny"])
        if kind == "alpha":
            rule["alpha"] = value = rng.choice([5e-324, 1e-17, 1e-300, 2.2e-308])
            return "decision_rule.alpha", value
        keys = sorted(crit["weights"])
        if kind == "huge":
            value = rng.choice([1e308, 1.7e308, 9e307])
            crit["weights"] = {k: value * (1 if j == 0 else -1) for j, k in enumerate(keys)}
        else:
            value = rng.choice([5e-324, 1e-320, 2e-310])
            crit["weights"][rng.choice(keys)] = value
        return "decision_rule.criteria[0].weights", value
    if family == "dup-key":
        where, target = rng.choice(_objects(base))
        key = rng.choice(sorted(target))
        first = rng.choice([0, "first", None, [1], {"a": 1}])
        text = _dump_with_duplicate(base, target, key, first)
        return (f"{where}.{key}" if where != "$" else key), text
    if family == "secret":
        path, old = rng.choice(strings)
        value = old + " " + rng.choice(SECRET_ENCODINGS)(SECRET)
        _set(data, path, value)
        return path, value
    raise AssertionError(family)


def _all_mutants() -> list[tuple[str, str, str, Any, dict[str, Any]]]:
    rng = random.Random(FUZZ_SEED)
    return [(s.name, *m) for s in SEED_PLANS for m in _mutants(s, rng)]


MUTANTS = _all_mutants()


def _under(error_path: str, path: str) -> bool:
    return error_path == path or error_path.startswith((path + ".", path + "["))


def test_the_fuzzer_makes_at_least_500_mutants_from_every_seed_plan() -> None:
    assert len(SEED_PLANS) >= 2 and len(MUTANTS) >= 500
    assert {m[0] for m in MUTANTS} == {p.name for p in SEED_PLANS}
    assert {m[1] for m in MUTANTS} == set(FAMILIES)  # every family is exercised
    per_family = {f: sum(m[1] == f for m in MUTANTS) for f in HOSTILE}
    assert min(per_family.values()) >= 2 * len(SEED_PLANS), per_family


def _printable(text: str) -> bool:
    """What an error line must be: encodable (no surrogate), without control bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return not any(ord(c) < 32 and c not in "\t" or ord(c) == 127 for c in text)


def test_every_mutant_is_rejected_at_its_path_or_rightly_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    wrong: list[str] = []
    start = time.monotonic()
    for seed, family, path, value, data in MUTANTS:
        # must not raise
        result = check_plan_text(value) if family == "dup-key" else check_plan_data(data)
        assert result.ok == (result.plan is not None)
        for problem in result.errors:
            assert problem.path and problem.message and "\n" not in problem.message
            line = str(problem)
            if not _printable(line) or SECRET in line:
                wrong.append(f"{seed} {family} {path}: unprintable or secret line {ascii(line)}")
        paths = [p.path for p in result.errors]
        shown = ascii(value)[:60] if family not in ("deep", "dup-key") else f"({family})"
        where = f"{seed} {family} {path}={shown}: {[ascii(str(e)) for e in result.errors][:3]}"
        if family in HOSTILE_AT_PATH:
            if path not in paths:
                wrong.append(f"wrongly accepted or refused elsewhere: {where}")
        elif family == "float-extreme":
            if not any(_under(p, path) for p in paths):
                wrong.append(f"float extreme not refused at its path: {where}")
        elif family == "safe-name":
            if not result.ok:
                wrong.append(f"safe arm names refused: {where}")
        elif family in ("non-finite", "domain", "bad-loss"):
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
    # fast enough to run on every commit: the budget is 60 s on two loaded cores
    assert time.monotonic() - start < 60


HOSTILE_AT_PATH = (
    "unsafe-name",
    "bad-backend",
    "non-rl-loss",
    "bad-string",
    "empty-text",
    "bad-revision",
    "dup-key",
    "secret",
)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1200, 100_000])
def test_deep_nesting_in_a_file_is_one_clear_problem(tmp_path: Path, depth: int) -> None:
    plan = _load(SEED_PLANS[0])
    text = json.dumps(plan)[:-1] + ', "feasibility": ' + "[" * depth + "]" * depth + "}"
    path = tmp_path / "deep.json"
    path.write_text(text)
    result = check_plan_file(path)
    assert [p.path for p in result.errors] == ["$"]
    assert f"nesting is {depth + 1} levels deep" in result.errors[0].message

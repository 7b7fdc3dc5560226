"""Semantic checks of a plan: every number in its domain, before anything costs time or money.

`validate.py` checks types and the relations between fields; this module checks what a value
*means*, on the raw JSON, with the JSON path of each problem:

- the file itself: at most `MAX_PLAN_BYTES` and `MAX_DEPTH` levels of nesting (a deeply nested
  file would otherwise end in a `RecursionError`);
- every string and key (`string_problems`): valid Unicode (no lone surrogate), no NUL or other
  control character, and free of the value of `TINKER_API_KEY` as written or encoded (JSON or
  Python escapes, %-encoding, HTML references, hex, base64: `holds_secret`), since the run
  directory keeps a byte copy of the plan, so a key in it would be stored;
- every JSON number finite (NaN and Infinity are not JSON, though Python's parser reads them);
- learning rates in (0, `MAX_LR`], Adam betas in [0, 1), eps > 0, weight decay >= 0;
- counts (rank, steps, batch, tokens, items) within what a machine and the task can hold;
- seeds in [0, 2**63);
- each arm's loss parameters checked against the loss's declaration
  (`losslab.losses.declarations`, the same `resolve` that `get_loss` runs), so `ppo(foo=1)` or
  `dppo_binary_tv(low=inf)` fail at `plan check`, not at step 0;
- `eval.n_examples` within a fixed-size task's test split and `dataset.hf_path` against the hub
  dataset the task loads, both as the task's registry line declares (`losslab.tasks.registry`);
- a decision rule whose verdict is fixed before any data (margin at or beyond the range of the
  weighted difference) refused; a negative margin reported as a non-inferiority test; a rule that
  can never decide at the eval's n reported;
- a required correctness preflight with no paths refused;
- plan fields this version accepts but never reads reported as warnings (`UNREAD_FIELDS`).

Layering: besides pydantic, `plan` reads two stdlib-only tables, the losses' declarations and
the tasks' registry, so `losslab plan check` never imports torch, tinker or datasets.
"""

from __future__ import annotations

import base64
import html
import math
import os
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from losslab.losses.declarations import loss_declaration
from losslab.plan.jsonvalues import format_number as _fmt
from losslab.plan.jsonvalues import json_dict as _dict
from losslab.plan.jsonvalues import json_int as _int
from losslab.plan.jsonvalues import json_list as _list
from losslab.plan.jsonvalues import json_number as _num
from losslab.plan.rule import hoeffding_half_width, weighted_range
from losslab.tasks.registry import task_declaration

if TYPE_CHECKING:
    from losslab.plan.loss_names import ResolvedLoss

MAX_PLAN_BYTES = 1 << 20
"""Largest plan file read (1 MiB); the seed plan is about 10 KB."""

MAX_DEPTH = 32
"""Deepest nesting of arrays/objects accepted; the seed plan nests 5 levels."""

MAX_LR = 1.0
"""Largest learning rate accepted: Adam moves every weight by about lr per step, so lr > 1
replaces the pretrained weights within one step."""

MAX_LORA_RANK = 1024
"""Largest LoRA rank accepted: above it an adapter is no longer low-rank for any model losslab
runs (hidden sizes 576 to 4096), and memory grows with rank x layers."""

COUNT_LIMITS: dict[str, int] = {
    "steps": 1_000_000,
    "batch_size": 1_000_000,
    "max_seq_len": 1 << 20,
    "eval.n_examples": 1_000_000,
    "dataset.n_examples": 100_000_000,
    "engine.group_size": 4096,
    "engine.groups_per_batch": 100_000,
    "engine.max_tokens": 1 << 20,
    "engine.eval_max_tokens": 1 << 20,
    "engine.pilot_steps": 1_000_000,
}
"""Upper bounds of counts: far above any real run, low enough that allocating for them cannot
exhaust memory or overflow a C integer before losslab says so."""

SEED_LIMIT = 2**63
NOT_FINITE = "is not a finite number"

SECRET_ENV_VARS = ("TINKER_API_KEY",)
MIN_SECRET_CHARS = 8  # a shorter value would match ordinary plan text by accident

UNREAD_FIELDS: dict[str, str] = {
    "eval.aggregation": "not read; the decision rule's criteria define the comparison",
    "feasibility": "not read; the feasibility projection is measured from the pilot",
}
"""Fields the schema accepts but no phase reads, with what happens instead; set (non-null)
in a plan, each gives a warning."""


class _Problems:
    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.warnings: list[tuple[str, str]] = []

    def err(self, path: str, message: str) -> None:
        self.errors.append((path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append((path, message))


# --- the file before parsing ---


def text_problems(text: str) -> list[tuple[str, str]]:
    """Size and nesting depth of the plan text, checked before `json.loads` (secrets: in the
    parsed strings, with their JSON paths, by `string_problems`; in text that does not parse,
    by `secret_problems`)."""
    out: list[tuple[str, str]] = []
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_PLAN_BYTES:
        out.append(("$", f"the plan file is {size} bytes; at most {MAX_PLAN_BYTES} are read"))
        return out
    depth, where = text_depth(text)
    if depth > MAX_DEPTH:
        out.append(
            (
                "$",
                f"nesting is {depth} levels deep (at character {where}); at most {MAX_DEPTH} "
                "are accepted",
            )
        )
    return out


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def text_depth(text: str) -> tuple[int, int]:
    """Deepest `[`/`{` nesting of JSON text (strings skipped) and the offset where it is reached."""
    blanked = _JSON_STRING.sub(lambda m: " " * len(m.group(0)), text)
    depth = deepest = at = 0
    for match in _BRACKET.finditer(blanked):
        if match.group(0) in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, match.start()
        else:
            depth -= 1
    return deepest, at


def data_depth(data: Any) -> int:
    """Nesting depth of parsed JSON (iterative, so any depth is measured without recursion)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_DEPTH:
                return depth
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, depth) for c in children)
    return deepest


def _unescape_backslashes(text: str) -> str:
    """`\\u0074`, `\\x74`, `\\U00000074` and `\\164` escapes decoded (a JSON or Python
    escape written inside a plan string, e.g. in a revision's Python-literal arguments)."""

    def one(match: re.Match[str]) -> str:
        digits = match.group(0)[1:]
        code = int(digits[1:], 16) if digits[0] in "uxU" else int(digits, 8)
        return chr(code) if code < 0x110000 else match.group(0)

    return _BACKSLASH_ESCAPE.sub(one, text)


_BACKSLASH_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|U[0-9a-fA-F]{8}|[0-7]{1,3})")
_DECODERS = (
    _unescape_backslashes,
    urllib.parse.unquote_plus,  # %74inker, +
    html.unescape,  # &#116;inker, &#x74;
)


def _encoded_forms(secret: str) -> tuple[str, ...]:
    """Forms of `secret` that decoding cannot recover from a larger text: hex, and the
    alignment-independent middle of its base64 (standard and URL-safe) at each of the three
    offsets a surrounding base64 text may put it at."""
    raw = secret.encode("utf-8")
    forms = [raw.hex(), raw.hex().upper()]
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw).decode("ascii")
        # the first group holds the padding bytes; the last group may hold '=' padding
        core = encoded[4 if pad else 0 : len(encoded) - 4]
        if len(core) >= MIN_SECRET_CHARS:
            forms += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(forms)


def holds_secret(text: str, secret: str) -> bool:
    """Whether `text` holds `secret` as written or in an encoding a reader could undo: JSON or
    Python backslash escapes, %-encoding, HTML character references (each up to twice, so a
    doubly escaped key is found), hex or base64."""
    if secret in text:
        return True
    seen, frontier = {text}, [text]
    for _ in range(2):  # two rounds: an escape inside a %-encoding, a doubly escaped key
        frontier = [
            d for t in frontier for d in (decode(t) for decode in _DECODERS) if d not in seen
        ]
        if any(secret in t for t in frontier):
            return True
        seen.update(frontier)
    return any(form in t for form in _encoded_forms(secret) for t in seen)


def secret_values() -> dict[str, str]:
    """Name -> value of each secret environment variable that is set (and long enough)."""
    out = {}
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if len(value) >= MIN_SECRET_CHARS:
            out[name] = value
    return out


def secret_problems(text: str) -> list[tuple[str, str]]:
    """A problem for each secret whose value appears in `text` (the value itself is not shown)."""
    return [
        (
            "$",
            f"the plan contains the value of {name}; remove it (the key is read from the "
            "environment only, and the run directory keeps a byte copy of the plan as plan.json)",
        )
        for name, value in secret_values().items()
        if holds_secret(text, value)
    ]


# --- the parsed plan ---

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters refused in any plan string: NUL ends a C string (a file name, a git
argument), and the others rewrite the terminal and the report that show the plan (tab, newline
and carriage return stay allowed in free text)."""


def _strings(data: Any) -> Iterator[tuple[str, str, bool]]:
    """(JSON path, string, is_key) for every object key and string value (iterative)."""
    stack: list[tuple[Any, str]] = [(data, "$")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                sub = f"{where}.{key}" if where != "$" else str(key)
                if isinstance(key, str):
                    yield sub, key, True
                stack.append((child, sub))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(value))
        elif isinstance(value, str):
            yield where, value, False


def _lone_surrogate(text: str) -> int | None:
    """Offset of the first lone UTF-16 surrogate (`"\\ud800"` parses to one), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def shown_path(path: str) -> str:
    """A JSON path as an error line may show it: escaped (`ascii`) when a key in it holds a
    surrogate or a control character, `$` when a key in it holds a secret's value."""
    if any(holds_secret(path, value) for value in secret_values().values()):
        return "$"
    if _lone_surrogate(path) is not None or _CONTROL.search(path):
        return ascii(path)
    return path


def string_problems(data: Any) -> list[tuple[str, str]]:
    """Every string and key of the parsed plan: valid Unicode, no control character, free of
    the secrets' values in any encoding (`holds_secret`). Checked before anything else reads a
    string, so no later message can print a surrogate, a control byte or a key.

    A path that itself holds a surrogate or a control character is shown escaped (`ascii`)."""
    out: list[tuple[str, str]] = []
    secrets = secret_values()
    for path, text, is_key in sorted(_strings(data), key=lambda item: item[0]):
        shown = shown_path(path)
        what = "this key" if is_key else "the string"
        at = _lone_surrogate(text)
        if at is not None:
            out.append(
                (
                    shown,
                    f"{what} holds a lone UTF-16 surrogate ({ascii(text[at])} at character {at}), "
                    "which is not valid Unicode and cannot be written as UTF-8",
                )
            )
            continue
        control = _CONTROL.search(text)
        if control is not None:
            name = "a NUL byte" if control.group(0) == "\x00" else "a control character"
            out.append(
                (
                    shown,
                    f"{what} holds {name} ({ascii(control.group(0))} at character {control.start()})",
                )
            )
            continue
        for name, value in secrets.items():
            if holds_secret(text, value):
                out.append(
                    (
                        shown,
                        f"the plan contains the value of {name} in {what} (as written or "
                        "encoded); remove it (the key is read from the environment only, and the "
                        "run directory keeps a byte copy of the plan as plan.json)",
                    )
                )
    return out


def _numbers(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every number in the JSON tree with its path (iterative: depth was bounded before)."""
    stack: list[tuple[Any, str]] = [(node, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                stack.append((child, f"{where}.{key}" if where != "$" else str(key)))
        elif isinstance(value, list):
            for i, child in enumerate(value):
                stack.append((child, f"{where}[{i}]"))
        elif _num(value) is not None:
            yield where, value


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def semantic_problems(data: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(errors, warnings) as (JSON path, message) pairs for a parsed plan object."""
    p = _Problems()
    if data_depth(data) > MAX_DEPTH:
        p.err("$", f"nesting is deeper than {MAX_DEPTH} levels")
        return p.errors, p.warnings
    _finite(data, p)
    _optimizers(data, p)
    _counts(data, p)
    _seeds(data, p)
    _preflight(data, p)
    _decision_rule(data, p)
    _unread(data, p)
    return p.errors, p.warnings


def _finite(data: dict[str, Any], p: _Problems) -> None:
    for path, value in sorted(_numbers(data, "$")):
        if isinstance(value, float) and not math.isfinite(value):
            p.err(path, f"{value!r} {NOT_FINITE} (NaN and Infinity are not JSON)")


def _check_lr(path: str, value: Any, p: _Problems) -> None:
    lr = _num(value)
    if lr is not None and math.isfinite(lr) and not 0 < lr <= MAX_LR:
        p.err(path, f"learning rate {_fmt(lr)} is outside (0, {_fmt(MAX_LR)}]")


def _check_adam(base: str, block: dict[str, Any], p: _Problems) -> None:
    for key in ("beta1", "beta2"):
        v = _num(block.get(key))
        if v is not None and math.isfinite(v) and not 0 <= v < 1:
            p.err(f"{base}.{key}", f"{_fmt(v)} is outside [0, 1), Adam's range for a beta")
    eps = _num(block.get("eps"))
    if eps is not None and math.isfinite(eps) and not eps > 0:
        p.err(f"{base}.eps", f"{_fmt(eps)} must be > 0 (it keeps Adam's division finite)")
    wd = _num(block.get("weight_decay"))
    if wd is not None and math.isfinite(wd) and not 0 <= wd <= 1:
        p.err(f"{base}.weight_decay", f"{_fmt(wd)} is outside [0, 1]")


def _optimizers(data: dict[str, Any], p: _Problems) -> None:
    optimizer = _dict(data.get("optimizer"))
    _check_lr("optimizer.lr", optimizer.get("lr"), p)
    _check_adam("optimizer", optimizer, p)
    for i, arm in enumerate(_list(data.get("arms"))):
        _check_lr(f"arms[{i}].lr", _dict(arm).get("lr"), p)
    groups = _list(_dict(data.get("restoration_preflight")).get("groups"))
    for g, group in enumerate(groups):
        for j, r_arm in enumerate(_list(_dict(group).get("arms"))):
            base = f"restoration_preflight.groups[{g}].arms[{j}].optimizer_config"
            cfg = _dict(_dict(r_arm).get("optimizer_config"))
            _check_lr(f"{base}.learning_rate", cfg.get("learning_rate"), p)
            _check_adam(base, cfg, p)


def _counts(data: dict[str, Any], p: _Problems) -> None:
    rank = _int(data.get("lora_rank"))
    if rank is not None and rank > MAX_LORA_RANK:
        p.err("lora_rank", f"{rank} is above {MAX_LORA_RANK}, the largest LoRA rank accepted")
    for path, limit in COUNT_LIMITS.items():
        v = _int(_get(data, path))
        if v is not None and v > limit:
            p.err(path, f"{v} is above {limit}, the largest value accepted")
    for i, arm in enumerate(_list(data.get("arms"))):
        u = _int(_dict(arm).get("updates_per_batch"))
        if u is not None and u > COUNT_LIMITS["engine.groups_per_batch"]:
            p.err(f"arms[{i}].updates_per_batch", f"{u} is above the largest groups_per_batch")
    engine = _dict(data.get("engine"))
    task = engine.get("task") or _dict(data.get("dataset")).get("name")
    n_eval = _int(_dict(data.get("eval")).get("n_examples"))
    if isinstance(task, str) and n_eval is not None:
        declared = task_declaration(task)
        size = declared.test_size if declared is not None else None
        if size is not None and n_eval > size:
            p.err(
                "eval.n_examples",
                f"{n_eval} items, but the {task} test split has {size}; the verdict would rest "
                "on fewer items than planned",
            )
    pilot, steps = _int(engine.get("pilot_steps")), _int(data.get("steps"))
    if pilot is not None and steps is not None and 0 < steps < pilot:
        p.warn(
            "engine.pilot_steps",
            f"{pilot} is more than steps {steps}; the pilot runs min(pilot_steps, rollout steps)",
        )


def _seeds(data: dict[str, Any], p: _Problems) -> None:
    places = [
        (f"arms[{i}].seed", _dict(a).get("seed")) for i, a in enumerate(_list(data.get("arms")))
    ]
    rule_seeds = _list(_dict(data.get("decision_rule")).get("seeds"))
    places += [(f"decision_rule.seeds[{i}]", s) for i, s in enumerate(rule_seeds)]
    for path, value in places:
        seed = _int(value)
        if seed is not None and not 0 <= seed < SEED_LIMIT:
            p.err(path, f"{seed} is outside [0, 2**63), the seeds torch and the backends accept")


def _preflight(data: dict[str, Any], p: _Problems) -> None:
    cp = data.get("correctness_preflight")
    if not isinstance(cp, dict):
        return
    required = cp.get("required", True)
    paths = cp.get("paths", [])
    if required is True and isinstance(paths, list) and not paths:
        p.err(
            "correctness_preflight.paths",
            "the preflight is required but lists no paths, so nothing would be checked; add a "
            "path or set required to false",
        )


def _decision_rule(data: dict[str, Any], p: _Problems) -> None:
    rule = _dict(data.get("decision_rule"))
    alpha = _num(rule.get("alpha"))
    n = _int(_dict(data.get("eval")).get("n_examples"))
    for c, crit in enumerate(_list(rule.get("criteria"))):
        crit = _dict(crit)
        base = f"decision_rule.criteria[{c}]"
        weights = crit.get("weights")
        bounds = crit.get("bounds")
        margin = _num(crit.get("margin", 0.0))
        if not isinstance(weights, dict) or not weights or not isinstance(bounds, list):
            continue
        ws = {k: _num(w) for k, w in weights.items()}
        bs = [_num(b) for b in bounds]
        if any(w is None or not math.isfinite(w) or w == 0 for w in ws.values()):
            continue  # validate.py reports the weight
        if len(bs) != 2 or any(b is None or not math.isfinite(b) for b in bs) or not bs[0] < bs[1]:  # type: ignore[operator]
            continue  # validate.py reports the bounds
        if margin is None or not math.isfinite(margin):
            continue
        low, high = weighted_range(ws, bs)  # type: ignore[arg-type]
        if not low < margin < high:
            continue  # validate.py refuses it: the verdict would be fixed before any data
        if margin < 0:
            p.warn(
                f"{base}.margin",
                f"{_fmt(margin)} < 0 makes this a non-inferiority test: 'validated' will mean "
                f"the weighted difference is above {_fmt(margin)} (no worse by more than "
                f"{_fmt(-margin)}), not that the treatment is better",
            )
        if alpha is not None and 0 < alpha < 1 and n is not None and n >= 1:
            hw = hoeffding_half_width(high - low, n, alpha)
            can_validate = high - hw > margin
            can_refute = low + hw < margin
            if not (can_validate or can_refute):
                p.warn(
                    f"{base}.margin",
                    f"at eval.n_examples {n} the Hoeffding half-width is {hw:.4g}, so no data can "
                    "move the interval off the margin: the verdict can only be 'inconclusive'",
                )


def _unread(data: dict[str, Any], p: _Problems) -> None:
    for path, why in UNREAD_FIELDS.items():
        if _get(data, path) is not None:
            p.warn(path, why)
    eval_temperature = _num(_dict(data.get("engine")).get("eval_temperature"))
    if eval_temperature is not None and eval_temperature != 0:
        p.warn(
            "engine.eval_temperature",
            f"{_fmt(eval_temperature)} is not read: evaluation always decodes greedily "
            "(temperature 0), as the decision rule's greedy accuracy assumes",
        )
    dataset = _dict(data.get("dataset"))
    task = _dict(data.get("engine")).get("task") or dataset.get("name")
    declared = task_declaration(task) if isinstance(task, str) else None
    loads = declared.hub_path if declared is not None else None
    hf_path, split = dataset.get("hf_path"), dataset.get("split")
    if isinstance(hf_path, str) and hf_path != loads:
        what = f"loads {loads}" if loads else "is generated offline"
        p.warn("dataset.hf_path", f"{hf_path!r} is not read; the task {task!r} {what}")
    if isinstance(split, str) and "train" not in split.split("/")[-1]:
        p.warn("dataset.split", f"{split!r} is not read; training always uses the train split")
    audit = data.get("generation_audit")
    if isinstance(audit, dict) and audit.get("required") is True:
        # the audit (losslab.tasks.audit) enforces overlap and one score per item only
        for key in ("max_label_errors", "min_sample_size"):
            if audit.get(key) is not None:
                p.warn(
                    f"generation_audit.{key}",
                    "is not checked: losslab's generation audit enforces max_eval_overlaps "
                    "and one score per item; the report lists the second grader's disagreements",
                )
    restoration = _dict(data.get("restoration_preflight"))
    if restoration.get("fixed_batch_required") is False:
        p.warn(
            "restoration_preflight.fixed_batch_required",
            "false is not honoured: the restoration preflight always compares the arms on one "
            "fixed batch",
        )


# --- loss parameters, by the losses' declarations ---


def loss_problems(resolved: Mapping[str, ResolvedLoss]) -> list[tuple[str, str]]:
    """Each arm's resolved loss (JSON path -> value) checked against its declaration with
    `LossDeclaration.resolve`, the check `losslab.losses.get_loss` runs when the run builds it;
    a ValueError becomes a problem at that path."""
    out = []
    for path, loss in resolved.items():
        if loss.user is not None:  # code: checked by `losslab.plan.user_loss` when resolved
            continue
        try:
            loss_declaration(loss.name).resolve(loss.values)
        except ValueError as exc:
            out.append((path, f"resolves to {loss.spec}, which its declaration refuses: {exc}"))
    return out

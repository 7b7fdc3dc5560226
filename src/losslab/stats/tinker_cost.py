"""The plan's cost on `--backend tinker`: tokens billed per kind and dollars at a dated price table.

Tinker bills tokens, not GPU-hours: prefill (prompt tokens a sampler or a forward pass reads),
sample (tokens it generates) and train (tokens a forward_backward runs), each at a per-model
price per million tokens. With P = groups_per_batch, G = group_size, L_p the mean prompt length
(`stats.cost.PromptLengths`), L_c = max_tokens (an upper bound: every completion runs to its cap),
R = rollout_steps, U the trained units (every arm at every seed, `training_units`), n = the
eval's items and L_e = eval_max_tokens:

    per rollout step   prefill  P L_p              one sample request per group (num_samples = G)
                       sample   P G L_c
                       train    P G (L_p + L_c)    every sequence once, over the U minibatches
                       prefill  P G (L_p + L_c)    the client-side custom loss's forward pass
                                                   (`forward_backward_custom` runs `forward`
                                                   first for the log-probs; priced as prefill)
    per evaluation     prefill  n L_p, sample n L_e   (the base model once, then every unit)

    tokens = U R (per step) + (U + 1) (per evaluation); dollars = sum_kind tokens / 1e6 x price

The pilot is the treatment arm's first steps (reused), so it adds nothing. Prices come from the
dated JSON table `tinker_prices.json` (its source and date travel with every projection);
`load_price_table(path)` reads an override of the same form. A model absent from the table is
priced through the table's `stand_ins` (named, with why) or not at all (tokens only).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from losslab.plan import Plan
from losslab.stats.feasibility import training_units

KINDS = ("prefill", "sample", "train")
PRICE_TABLE = "tinker_prices.json"


@dataclass(frozen=True)
class PriceTable:
    """USD per million tokens by model and kind, with the date and source they were read."""

    date: str
    source: str
    models: dict[str, dict[str, float]]
    stand_ins: dict[str, dict[str, str]] = field(default_factory=dict)
    path: str = ""

    def price(self, model: str) -> tuple[dict[str, float] | None, str]:
        """(prices, how) of `model` (its `@revision` ignored): its own row, a stand-in's row
        (how names it and why), or (None, why not)."""
        name = model.partition("@")[0]
        if name in self.models:
            return self.models[name], f"{name}'s listed price"
        stand_in = self.stand_ins.get(name)
        if stand_in is not None and stand_in.get("priced_as") in self.models:
            other = stand_in["priced_as"]
            return self.models[other], f"priced as {other}: {stand_in.get('why', '')}".rstrip(": ")
        return None, f"{name} is not in the price table ({self.path or PRICE_TABLE})"


def plan_price_table(value: str | None, plan_file: str | Path) -> Path | None:
    """The plan's `engine.price_table`, a relative path read from the plan file's folder."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(plan_file).resolve().parent / path


def load_price_table(path: str | Path | None = None) -> PriceTable:
    """The price table at `path` (a JSON file of `tinker_prices.json`'s form), or the bundled one.

    Raises:
        ValueError: naming the file and the field that is missing or not a price.
    """
    if path is None:
        text = resources.files("losslab.stats").joinpath(PRICE_TABLE).read_text()
        where = f"losslab/stats/{PRICE_TABLE}"
    else:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"price table {path}: cannot be read ({e.strerror or e})") from None
        where = str(path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"price table {where}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"price table {where}: expected a JSON object")
    for key in ("date", "source"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ValueError(f"price table {where}: field {key!r} must be a non-empty string")
    models = raw.get("models")
    if not isinstance(models, dict) or not models:
        raise ValueError(f"price table {where}: field 'models' must map model names to prices")
    for name, row in models.items():
        for kind in KINDS:
            value = row.get(kind) if isinstance(row, dict) else None
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"price table {where}: models.{name}.{kind} = {value!r}; expected a "
                    "price >= 0 in USD per million tokens"
                )
    stand_ins = raw.get("stand_ins") or {}
    if not isinstance(stand_ins, dict):
        raise ValueError(f"price table {where}: field 'stand_ins' must be an object")
    return PriceTable(
        date=raw["date"],
        source=raw["source"],
        models={n: {k: float(r[k]) for k in KINDS} for n, r in models.items()},
        stand_ins=stand_ins,
        path=where,
    )


@dataclass
class TinkerCost:
    """Tokens by kind (and by where they are spent) and dollars at one price table."""

    model: str
    tokens: dict[str, float]
    parts: dict[str, dict[str, float]]
    prices: dict[str, float] | None
    dollars: dict[str, float] | None
    priced: str
    table_date: str
    table_source: str
    assumptions: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def total_dollars(self) -> float | None:
        return None if self.dollars is None else sum(self.dollars.values())

    def lines(self) -> list[str]:
        """The card as `plan show` prints it."""
        t = self.tokens
        out = [
            f"Tinker cost (--backend tinker, {self.model}; prices of {self.table_date})",
            f"  tokens     prefill {t['prefill']:,.0f}, sample {t['sample']:,.0f}, "
            f"train {t['train']:,.0f}",
        ]
        for part, kinds in self.parts.items():
            text = ", ".join(f"{k} {v:,.0f}" for k, v in kinds.items() if v)
            out.append(f"    {part:<30} {text}")
        if self.dollars is None or self.prices is None:
            out.append(f"  dollars    not priced: {self.priced}")
        else:
            d, p = self.dollars, self.prices
            out.append(
                f"  dollars    ${self.total_dollars:,.2f} = prefill ${d['prefill']:,.2f} + "
                f"sample ${d['sample']:,.2f} + train ${d['train']:,.2f} (at ${p['prefill']:g} / "
                f"${p['sample']:g} / ${p['train']:g} per M tokens; {self.priced})"
            )
        out.append(f"  prices     {self.table_source}")
        out.append("  assumes    " + "; ".join(self.assumptions))
        return out


def tinker_cost(plan: Plan, prompt_tokens: float, table: PriceTable | None = None) -> TinkerCost:
    """The plan's Tinker token counts and dollars (formulas: module docstring) for a mean
    prompt of `prompt_tokens` tokens, at `table` (default: the bundled, dated one)."""
    table = table or load_price_table()
    e, lp = plan.engine, float(prompt_tokens)
    groups, rows, lc = e.groups_per_batch, e.groups_per_batch * e.group_size, e.max_tokens
    units = len(training_units(plan))
    steps, n, le = plan.rollout_steps, plan.eval.n_examples, e.eval_max_tokens
    sequences = rows * (lp + lc)
    trained = units * steps * sequences
    parts = {
        f"sampling ({units} x {steps} steps)": _kinds(
            prefill=units * steps * groups * lp, sample=units * steps * rows * lc
        ),
        "training (forward_backward)": _kinds(train=trained),
        "custom loss forward pass": _kinds(prefill=trained),
        f"evaluation ({units + 1} x {n} items)": _kinds(
            prefill=(units + 1) * n * lp, sample=(units + 1) * n * le
        ),
    }
    tokens = {k: sum(p[k] for p in parts.values()) for k in KINDS}
    prices, priced = table.price(plan.base_model)
    dollars = None if prices is None else {k: tokens[k] / 1e6 * prices[k] for k in KINDS}
    return TinkerCost(
        model=plan.base_model,
        tokens=tokens,
        parts=parts,
        prices=prices,
        dollars=dollars,
        priced=priced,
        table_date=table.date,
        table_source=f"{table.path}: {table.source}",
        assumptions=[
            f"completions run to max_tokens = {lc} (eval: {le})",
            f"{units} trained arms (every arm at every seed) and the base model's evaluation",
            f"prompts {lp:.0f} tokens mean, prefilled once per group of {e.group_size}",
            "the custom loss's forward pass billed as prefill; no cached-prefill discount",
            "preflights and the restoration batch not counted",
        ],
    )


def _kinds(prefill: float = 0.0, sample: float = 0.0, train: float = 0.0) -> dict[str, float]:
    return {"prefill": prefill, "sample": sample, "train": train}

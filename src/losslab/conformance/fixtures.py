"""Conformance fixtures: ragged, prompt-masked batches with stale current log-probs.

The generator is the one recorded in the `generator` block of the team's golden file
`conformance/tinker_ppo_and_dppo_seed0.json` (set A); `generate_fixture(FixtureSpec())`
regenerates that file's sequences bit for bit. Draw order (numpy `default_rng(seed)`, PCG64):
lengths, prompt lengths, then per sequence: mixture components, exponentials, noise and
prompt-position current log-probs (each drawn over the full length L_i), then advantages.

A fixture is "stale": current log-probs are the sampler's plus N(0, noise_sd) noise, so the GRPO
ratio clip and the DPPO divergence mask both fire on a real share of tokens, and one sequence
has zero advantage (its ratio losses must give zero gradient).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

# Descriptive (text) keys of a golden file's generator block: read past, never interpreted.
_TEXT_KEYS = frozenset(
    {
        "rng",
        "length",
        "prompt_length",
        "sampler_logprobs",
        "current_logprobs",
        "advantages",
        "boundary_margins_float64",
    }
)


@dataclass(frozen=True)
class ExtremeToken:
    """Overwrite one token after generation (to probe overflow / threshold edge cases)."""

    seq: int
    pos: int
    sampler_logprob: float | None = None
    current_logprob: float | None = None
    old_logprob: float | None = None  # only when the spec draws old log-probs


@dataclass(frozen=True)
class FixtureSpec:
    """Parameters of the fixture generator (names as in the golden file's `generator` block).

    Args:
        seed: numpy `default_rng` seed.
        n_seq: number of sequences (datums).
        len_lo, len_hi: inclusive range of sequence lengths L_i.
        prompt_lo, prompt_hi: inclusive range of prompt lengths (capped at L_i - 1); the loss
            mask is 0 on prompt positions and 1 after.
        noise_sd: std of the N(0, sd) noise added to sampler log-probs to get current log-probs;
            0 makes the batch on-policy (no clip or mask fires).
        zero_adv_idx: index of the sequence whose advantage is forced to 0 (None: none).
        mixture_weights, mixture_scales: sampler log-prob = -scale_c * Exp(1), c ~ weights.
        logprob_floor: lower cap of sampler log-probs.
        extreme_tokens: tokens overwritten after generation.
        old_noise_sd: > 0 adds recomputed "old" log-probs = sampler + N(0, old_noise_sd) on
            response tokens (capped at 0; = sampler on prompt positions), drawn from
            `default_rng(old_seed)` after everything else, so old != sampler and the
            anchor conventions separate. 0 (default): no old log-probs (old = sampler).
        old_seed: seed of the old log-prob draws.
        masked_seq_idx: a sequence whose loss mask is all zero (None: none).
        advantage_scale: factor on the drawn advantages (1: set A, whose 16 draws have std
            1.00043, so a loss that re-normalises advantages to std 1 looks right on it; the
            atlas stress fixture uses 2.5).
    """

    seed: int = 0
    n_seq: int = 16
    len_lo: int = 40
    len_hi: int = 96
    prompt_lo: int = 8
    prompt_hi: int = 24
    noise_sd: float = 0.6
    zero_adv_idx: int | None = 5
    mixture_weights: tuple[float, ...] = (0.2, 0.5, 0.3)
    mixture_scales: tuple[float, ...] = (0.3, 1.0, 4.0)
    logprob_floor: float = -30.0
    extreme_tokens: tuple[ExtremeToken, ...] = field(default_factory=tuple)
    old_noise_sd: float = 0.0
    old_seed: int = 1
    masked_seq_idx: int | None = None
    advantage_scale: float = 1.0

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(
                f"fixture generator {name} = {getattr(self, name)!r}; expected {expected}"
            )

        for name in ("seed", "n_seq", "len_lo", "len_hi", "prompt_lo", "prompt_hi"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad(name, "a non-negative integer")
        if self.n_seq < 1:
            raise bad("n_seq", "at least 1")
        if self.len_lo < 2 or self.len_hi < self.len_lo:
            raise bad("len_hi", f"len_hi >= len_lo >= 2 (len_lo = {self.len_lo})")
        if self.prompt_hi < self.prompt_lo:
            raise bad("prompt_hi", f">= prompt_lo = {self.prompt_lo}")
        if not (
            isinstance(self.noise_sd, (int, float))
            and math.isfinite(self.noise_sd)
            and self.noise_sd >= 0
        ):
            raise bad("noise_sd", "a finite number >= 0")
        if self.zero_adv_idx is not None and not 0 <= self.zero_adv_idx < self.n_seq:
            raise bad("zero_adv_idx", f"None or an index in [0, {self.n_seq})")
        if self.masked_seq_idx is not None and not 0 <= self.masked_seq_idx < self.n_seq:
            raise bad("masked_seq_idx", f"None or an index in [0, {self.n_seq})")
        if not (
            isinstance(self.old_noise_sd, (int, float))
            and math.isfinite(self.old_noise_sd)
            and self.old_noise_sd >= 0
        ):
            raise bad("old_noise_sd", "a finite number >= 0")
        if not (
            isinstance(self.advantage_scale, (int, float))
            and not isinstance(self.advantage_scale, bool)
            and math.isfinite(self.advantage_scale)
            and self.advantage_scale > 0
        ):
            raise bad("advantage_scale", "a finite number > 0")
        if len(self.mixture_weights) != len(self.mixture_scales) or not self.mixture_weights:
            raise bad("mixture_weights", "as many weights as mixture_scales")
        if abs(sum(self.mixture_weights) - 1.0) > 1e-9:
            raise bad("mixture_weights", "weights summing to 1")
        for tok in self.extreme_tokens:
            if not 0 <= tok.seq < self.n_seq:
                raise ValueError(
                    f"fixture extreme_tokens seq = {tok.seq}; expected an index "
                    f"in [0, {self.n_seq})"
                )

    @classmethod
    def from_generator_block(cls, block: Mapping[str, Any]) -> FixtureSpec:
        """Read a golden file's `generator` block (text keys describe the recipe; skipped)."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(block) - known - _TEXT_KEYS
        if unknown:
            raise ValueError(
                f"generator block has unknown keys {sorted(unknown)}; expected "
                f"{sorted(known)} (plus descriptive text keys)"
            )
        kwargs: dict[str, Any] = {k: v for k, v in block.items() if k in known}
        for key in ("mixture_weights", "mixture_scales"):
            if key in kwargs:
                kwargs[key] = tuple(float(x) for x in kwargs[key])
        kwargs["extreme_tokens"] = tuple(
            ExtremeToken(**tok) if isinstance(tok, Mapping) else tok
            for tok in kwargs.get("extreme_tokens", ())
        )
        return cls(**kwargs)

    def to_generator_block(self) -> dict[str, Any]:
        block = asdict(self)
        for key, default in (
            ("old_noise_sd", 0.0),
            ("old_seed", 1),
            ("masked_seq_idx", None),
            ("advantage_scale", 1.0),
        ):
            if block[key] == default:  # set A's block stays as the team's golden file has it
                del block[key]
        block["mixture_weights"] = list(self.mixture_weights)
        block["mixture_scales"] = list(self.mixture_scales)
        block["extreme_tokens"] = [
            {k: v for k, v in asdict(t).items() if v is not None or k != "old_logprob"}
            for t in self.extreme_tokens
        ]
        block["rng"] = (
            "numpy.random.default_rng(seed) (PCG64); draws in this order: lengths, "
            "prompt lengths, then per sequence i=0..n-1 (each over the full length "
            "L_i): mixture components, exponentials, noise, prompt-position current "
            "logprobs; then advantages"
        )
        return block


@dataclass(frozen=True)
class FixtureSequence:
    """One datum of a fixture; arrays are float32 of length L (prompt positions included)."""

    sampler_logprobs: np.ndarray
    current_logprobs: np.ndarray
    loss_mask: np.ndarray
    advantage: float  # float32 value, broadcast over loss-mask tokens
    prompt_length: int
    old_logprobs: np.ndarray | None = None  # recomputed old log-probs; None: old = sampler

    @property
    def advantages(self) -> np.ndarray:
        return (np.float32(self.advantage) * self.loss_mask).astype(np.float32)


@dataclass(frozen=True)
class Fixture:
    """A batch of ragged sequences plus the spec it came from (None when read from a file)."""

    sequences: tuple[FixtureSequence, ...]
    spec: FixtureSpec | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(s.sampler_logprobs) for s in self.sequences]

    def to_json_dict(self) -> dict[str, Any]:
        """The canonical JSON form: per-sequence lists of float32 values as Python floats."""
        rows = []
        for s in self.sequences:
            row: dict[str, Any] = {
                "sampler_logprobs": [float(x) for x in s.sampler_logprobs],
                "current_logprobs": [float(x) for x in s.current_logprobs],
                "loss_mask": [float(x) for x in s.loss_mask],
                "advantage": float(s.advantage),
                "prompt_length": int(s.prompt_length),
            }
            if s.old_logprobs is not None:
                row["old_logprobs"] = [float(x) for x in s.old_logprobs]
            rows.append(row)
        return {
            "generator": self.spec.to_generator_block() if self.spec is not None else None,
            "sequences": rows,
        }

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace; the sequences only (the spec is recorded beside it)."""
        body = {"sequences": self.to_json_dict()["sequences"]}
        return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def description(self) -> str:
        n_loss = sum(int(s.loss_mask.sum()) for s in self.sequences)
        lo, hi = min(self.lengths), max(self.lengths)
        text = (
            f"{len(self.sequences)} ragged sequences (len {lo}-{hi}), prompt-masked, "
            f"{n_loss} loss tokens"
        )
        if self.spec is not None:
            text += (
                f"; stale current logprobs = sampler + N(0,{self.spec.noise_sd}) capped at 0 "
                f"(numpy default_rng seed {self.spec.seed})"
            )
            if self.spec.zero_adv_idx is not None:
                text += f"; sequence {self.spec.zero_adv_idx} has zero advantage"
            if self.spec.masked_seq_idx is not None:
                text += f"; sequence {self.spec.masked_seq_idx} is fully masked"
            if self.spec.old_noise_sd:
                text += f"; old logprobs = sampler + N(0,{self.spec.old_noise_sd})"
            if self.spec.extreme_tokens:
                text += f"; {len(self.spec.extreme_tokens)} injected extreme tokens"
        return text

    @classmethod
    def from_json_sequences(
        cls,
        sequences: list[Mapping[str, Any]],
        spec: FixtureSpec | None = None,
        where: str = "sequences",
    ) -> Fixture:
        """Read sequences in the golden file's form (float32 values stored as JSON floats)."""
        out = []
        for i, seq in enumerate(sequences):
            missing = {"sampler_logprobs", "current_logprobs", "loss_mask", "advantage"} - set(seq)
            if missing:
                raise ValueError(f"{where}[{i}] lacks {sorted(missing)}")
            arrays = [
                np.asarray(seq[k], dtype=np.float32)
                for k in ("sampler_logprobs", "current_logprobs", "loss_mask")
            ]
            if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
                raise ValueError(
                    f"{where}[{i}]: sampler_logprobs, current_logprobs and loss_mask "
                    f"must be 1-D of one length, got {[a.shape for a in arrays]}"
                )
            mask = arrays[2]
            prompt = int(
                seq.get("prompt_length", int(np.argmax(mask > 0)) if mask.any() else len(mask))
            )
            old = None
            if seq.get("old_logprobs") is not None:
                old = np.asarray(seq["old_logprobs"], dtype=np.float32)
                if old.shape != mask.shape:
                    raise ValueError(
                        f"{where}[{i}]: old_logprobs has {old.size} values, the sequence "
                        f"has {mask.size}"
                    )
            out.append(
                FixtureSequence(
                    arrays[0], arrays[1], mask, float(np.float32(seq["advantage"])), prompt, old
                )
            )
        return cls(tuple(out), spec)


def generate_fixture(spec: FixtureSpec | None = None) -> Fixture:
    """Generate the fixture of `spec` (default: set A, seed 0, 16 sequences of length 40-96)."""
    spec = spec or FixtureSpec()
    rng = np.random.default_rng(spec.seed)
    lengths = rng.integers(spec.len_lo, spec.len_hi + 1, size=spec.n_seq)
    prompts = np.minimum(
        rng.integers(spec.prompt_lo, spec.prompt_hi + 1, size=spec.n_seq), lengths - 1
    )
    scales = np.asarray(spec.mixture_scales, dtype=np.float64)
    rows = []
    for length, prompt in zip(lengths.tolist(), prompts.tolist(), strict=True):
        response = np.arange(length) >= prompt  # loss mask, [L]
        component = rng.choice(len(scales), size=length, p=list(spec.mixture_weights))
        exponential = rng.exponential(1.0, size=length)
        sampler = np.where(
            response, np.maximum(-scales[component] * exponential, spec.logprob_floor), 0.0
        ).astype(np.float32)
        noise = rng.normal(0.0, spec.noise_sd, size=length)
        # capped at 0 so probabilities stay <= 1 (binary KL takes log(1 - p))
        current_response = np.minimum(sampler.astype(np.float64) + noise, 0.0)
        prompt_current = -rng.exponential(1.0, size=length)  # masked; must get zero gradient
        current = np.where(response, current_response, prompt_current).astype(np.float32)
        rows.append((sampler, current, response.astype(np.float32), prompt))
    advantages = rng.normal(0.0, 1.0, size=spec.n_seq).astype(np.float32)
    if spec.advantage_scale != 1.0:
        advantages = (advantages * np.float32(spec.advantage_scale)).astype(np.float32)
    if spec.zero_adv_idx is not None:
        advantages[spec.zero_adv_idx] = 0.0
    for tok in spec.extreme_tokens:
        sampler, current, _, _ = rows[tok.seq]
        if not 0 <= tok.pos < len(sampler):
            raise ValueError(
                f"fixture extreme_tokens pos = {tok.pos} for seq {tok.seq}; expected "
                f"an index in [0, {len(sampler)})"
            )
        if tok.sampler_logprob is not None:
            sampler[tok.pos] = np.float32(tok.sampler_logprob)
        if tok.current_logprob is not None:
            current[tok.pos] = np.float32(tok.current_logprob)
    if spec.masked_seq_idx is not None:
        sampler, current, mask, _ = rows[spec.masked_seq_idx]
        rows[spec.masked_seq_idx] = (sampler, current, np.zeros_like(mask), len(mask))
    olds: list[np.ndarray | None] = [None] * len(rows)
    if spec.old_noise_sd:
        old_rng = np.random.default_rng(spec.old_seed)
        for i, (sampler, _, mask, _) in enumerate(rows):
            noise = old_rng.normal(0.0, spec.old_noise_sd, size=len(sampler))
            drawn = np.minimum(sampler.astype(np.float64) + noise, 0.0)
            olds[i] = np.where(mask > 0, drawn, sampler).astype(np.float32)
        for tok in spec.extreme_tokens:
            if tok.old_logprob is not None:
                olds[tok.seq][tok.pos] = np.float32(tok.old_logprob)  # type: ignore[index]
    sequences = tuple(
        FixtureSequence(s, c, m, float(a), int(p), old)
        for (s, c, m, p), a, old in zip(rows, advantages.tolist(), olds, strict=True)
    )
    return Fixture(sequences, spec)


# (sampler -> current) log-prob pairs injected by the stress fixture, per team notes
# dppo_implementations.md §2.2: r ~ 20 and r ~ 12 (above a cap of 10), log-ratio +22 and -22
# (past every guard at 20), and +20.5 with p moving by 0.61 (masked for A > 0, kept for A < 0).
STRESS_PAIRS = ((-8.0, -5.0), (-25.0, -3.0), (-3.0, -25.0), (-21.0, -0.5), (-6.0, -3.5))
STRESS_FIRST_POS = 19  # response tokens of sequences 0 (A = +1.02) and 1 (A = -0.82) in set A


def stress_spec() -> FixtureSpec:
    """The stress fixture: set A, plus old = sampler + N(0, 0.3) (seed 1), the `STRESS_PAIRS`
    injected into sequence 0 (A > 0) and sequence 1 (A < 0) from position 19, sequence 7 fully
    masked and sequence 5 with zero advantage. On it a missing cap, a wrong anchor, a wrong
    threshold and a sign error each change the gradient (tests/conformance/test_stress.py)."""
    tokens = tuple(
        ExtremeToken(seq, STRESS_FIRST_POS + k, sampler, current)
        for seq in (0, 1)
        for k, (sampler, current) in enumerate(STRESS_PAIRS)
    )
    return FixtureSpec(extreme_tokens=tokens, old_noise_sd=0.3, old_seed=1, masked_seq_idx=7)


# (sampler -> current) log-prob pair the atlas stress fixture adds at position 24 of sequences 0
# (A > 0) and 1 (A < 0): log r = +91 > 88.72 = log(float32 max), so an unguarded exp gives inf
# and the log-ratio guards "none" and "upper" (exp(min(log r, 20))) differ on it.
OVERFLOW_PAIR = (-92.0, -1.0)
OVERFLOW_POS = 24
ATLAS_ADVANTAGE_SCALE = 2.5


def atlas_stress_spec() -> FixtureSpec:
    """The atlas's stress fixture: `stress_spec()` plus the `OVERFLOW_PAIR` at position 24 of
    sequences 0 and 1, and the advantages scaled by 2.5 (std 2.50, not 1.00043), so a loss
    that re-normalises the advantages changes the gradient. A new fixture: the golden files
    made from `stress_spec()` keep theirs."""
    base = stress_spec()
    overflow = tuple(ExtremeToken(seq, OVERFLOW_POS, *OVERFLOW_PAIR) for seq in (0, 1))
    return replace(
        base,
        extreme_tokens=base.extreme_tokens + overflow,
        advantage_scale=ATLAS_ADVANTAGE_SCALE,
    )


def token_tensors(
    fixture: Fixture, dtype: Any = None, requires_grad: bool = True
) -> dict[str, list]:
    """Per-datum torch tensors (`logprobs_D`, `sampler_logprobs_D`, `advantages_D`, `mask_D`,
    and `old_logprobs_D`: the recomputed old log-probs, the sampler's where a sequence has none)."""
    import torch

    dtype = dtype or torch.float32
    return {
        # a fixture without old log-probs has old = sampler (set A)
        "old_logprobs_D": [
            torch.tensor(
                s.sampler_logprobs if s.old_logprobs is None else s.old_logprobs, dtype=dtype
            )
            for s in fixture.sequences
        ],
        "logprobs_D": [
            torch.tensor(s.current_logprobs, dtype=dtype).requires_grad_(requires_grad)
            for s in fixture.sequences
        ],
        "sampler_logprobs_D": [
            torch.tensor(s.sampler_logprobs, dtype=dtype) for s in fixture.sequences
        ],
        "advantages_D": [torch.tensor(s.advantages, dtype=dtype) for s in fixture.sequences],
        "mask_D": [torch.tensor(s.loss_mask, dtype=dtype) for s in fixture.sequences],
    }


def boundary_margins(
    fixture: Fixture,
    ratio_bounds: tuple[float, ...] = (0.8, 1.2),
    tv_thresholds: tuple[float, ...] = (0.15, 0.1),
) -> dict[str, float]:
    """Smallest float64 distance of any loss token to a clip/mask threshold (round-off safety)."""
    cur = np.concatenate([s.current_logprobs[s.loss_mask > 0] for s in fixture.sequences]).astype(
        np.float64
    )
    smp = np.concatenate([s.sampler_logprobs[s.loss_mask > 0] for s in fixture.sequences]).astype(
        np.float64
    )
    ratio = np.exp(cur - smp)
    tv = np.abs(np.exp(cur) - np.exp(smp))
    out = {f"min_abs(ratio-{b})": float(np.min(np.abs(ratio - b))) for b in ratio_bounds}
    out.update(
        {f"min_abs(|p-p_sampler|-{t})": float(np.min(np.abs(tv - t))) for t in tv_thresholds}
    )
    return out

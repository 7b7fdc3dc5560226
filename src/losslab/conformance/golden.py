"""Golden files: a portable record of reference losses and gradients on one fixture.

The format is the team's `conformance/tinker_ppo_and_dppo_seed0.json`: `generator` (fixture
recipe), `sequences` (per datum: sampler_logprobs, current_logprobs, loss_mask, advantage,
prompt_length), `reference` (which source produced the outputs), and `outputs`, one per
reference configuration: `params`, `loss`, `token_count`, `per_sequence_loss`,
`grad_current_logprobs` (per datum, full length), clip/mask counts and `float64_check`
(`loss_term_abs_sum_float64` is the scale for loss tolerances).

`check_golden` recomputes each output with the `losslab.losses` configuration that matches its
framework (`frameworks.<name>.losslab_config`; losslab's re-derivation only where no
configuration can reproduce it, e.g. Stable-RL's ablation modes) and reports the loss error
relative to `loss_term_abs_sum_float64`, the worst gradient error relative to max(1, |g|), and
the clip/mask token sets that differ (inferred on both sides from exact-zero gradients). `make_golden` writes such a file from
pinned source executed from a user's checkout (or, explicitly, from the re-derivation).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.atomic import atomic_write_json
from losslab.conformance.fixtures import Fixture, FixtureSpec, boundary_margins, generate_fixture
from losslab.conformance.frameworks import (
    ReferenceResult,
    ResolvedReference,
    rederive,
    registry,
    resolve_reference,
    spindle,
    stable_rl,
)
from losslab.conformance.ours import config_losses, run_ours
from losslab.conformance.pinned import run_pinned
from losslab.conformance.provenance import provenance_of
from losslab.plan import Revision, RevisionError, parse_revision

DEFAULT_TOLERANCE = 1e-6
# The team's golden format (set A, `tinker_ppo_and_dppo_seed0.json`) predates revisions: it names
# these two frameworks by output name or `loss_mode`, records Spindle's `loss_config` (and its
# loss name) as an output's params and Stable-RL's call arguments, not effective parameters.
_TEAM_FORMAT = (spindle.FRAMEWORK.name, stable_rl.FRAMEWORK.name)
# Stable-RL params in the set A file that document the call and are not arguments to map.
_STABLE_RL_DOC_KEYS = frozenset({"rollout_log_prob", "old_log_prob"})
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class GoldenFileError(ValueError):
    """The golden file is unreadable or malformed; the message names the field."""


@dataclass
class OutputCheck:
    """One output of a golden file, recomputed."""

    name: str
    passed: bool
    reference: str = ""  # what we mapped it to, e.g. "sail-sg/Stable-RL dppo_binary_tv"
    error: str = ""  # why it could not be mapped or run
    loss_error: float = float("nan")  # |ours - golden| / loss_term_abs_sum_float64
    per_sequence_error: float = float("nan")  # worst per-sequence loss, same scale
    grad_error: float = float("nan")  # max |ours - golden| / max(1, |golden|)
    count_ours: int | None = None  # clipped/masked loss tokens
    count_golden: int | None = None
    only_ours: list[tuple[int, int]] = field(default_factory=list)  # (seq, t), A != 0
    only_golden: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (v if not isinstance(v, float) or np.isfinite(v) else None)
            for k, v in self.__dict__.items()
        }


@dataclass
class GoldenReport:
    path: str
    outputs: list[OutputCheck]
    fixture_sha256: str
    generator_reproduces: bool | None  # None: no generator block to regenerate from
    loss_tolerance: float
    grad_tolerance: float

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "passed": self.passed,
            "fixture_sha256": self.fixture_sha256,
            "generator_reproduces": self.generator_reproduces,
            "loss_tolerance": self.loss_tolerance,
            "grad_tolerance": self.grad_tolerance,
            "outputs": [o.to_dict() for o in self.outputs],
        }


def read_golden(path: str | Path) -> dict[str, Any]:
    """Load and shape-check a golden file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise GoldenFileError(f"golden file {path} does not exist") from err
    except json.JSONDecodeError as err:
        raise GoldenFileError(f"golden file {path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise GoldenFileError(f"golden file {path}: expected a JSON object at the top")
    for key, kind in (("sequences", list), ("outputs", dict)):
        if not isinstance(data.get(key), kind):
            raise GoldenFileError(
                f"golden file {path}: '{key}' is missing or not a {kind.__name__}"
            )
    return data


def _revision_for(data: Mapping[str, Any], name: str, out: Mapping[str, Any]) -> Revision:
    """Map one output to a Revision of a registered framework (RevisionError when it can't)."""
    params = dict(out.get("params") or {})
    ref_block = out.get("reference") if isinstance(out.get("reference"), Mapping) else None
    sources = data.get("reference") if isinstance(data.get("reference"), Mapping) else {}
    if ref_block is not None and isinstance(ref_block.get("revision"), str):
        text = ref_block["revision"].split(" [golden output")[0]
        try:
            return parse_revision(text)
        except RevisionError as err:
            raise RevisionError(f"output {name!r}: reference.revision: {err}") from None
    if ref_block is not None:
        repo, function = ref_block.get("repo"), ref_block.get("function")
        adapter = {spindle.REPO: "spindle", stable_rl.REPO: "stable_rl"}.get(repo)
        commit, path = ref_block.get("commit", "0" * 40), ref_block.get("path", "")
        loss_name = ref_block.get("loss_name")
    elif "loss_mode" in params:
        adapter, function, loss_name = "stable_rl", "compute_policy_loss_with_mask", None
        block = sources.get("stable_rl", {})
        repo, commit, path = stable_rl.REPO, block.get("commit", "0" * 40), block.get("path", "")
    elif name.startswith("spindle_"):
        adapter, function = "spindle", "_loss"
        rest = name.removeprefix("spindle_")
        matches = [n for n in spindle.LOSS_KEYS if rest == n or rest.startswith(n + "_")]
        loss_name = max(matches, key=len) if matches else None
        block = sources.get("spindle", {})
        repo, commit, path = spindle.REPO, block.get("commit", "0" * 40), block.get("path", "")
    else:
        raise RevisionError(
            f"output {name!r}: cannot tell its reference (no 'reference' block, "
            "no Stable-RL loss_mode, no 'spindle_<loss>' name)"
        )
    if adapter == "spindle":
        if loss_name not in spindle.LOSS_KEYS:
            raise RevisionError(
                f"output {name!r}: Spindle loss name {loss_name!r} is not one of "
                f"{sorted(spindle.LOSS_KEYS)}"
            )
        config = params.pop("loss_config", params)
        kwargs = {"loss_name": loss_name, **config}
    elif adapter == "stable_rl":
        unknown = set(params) - set(stable_rl.KEYS) - _STABLE_RL_DOC_KEYS
        if unknown:
            raise RevisionError(
                f"output {name!r}: Stable-RL params {sorted(unknown)} are not "
                f"arguments losslab maps ({list(stable_rl.KEYS)})"
            )
        kwargs = {k: v for k, v in params.items() if k in stable_rl.KEYS}
    else:
        known = ", ".join(fw.repo for fw in registry().values())
        raise RevisionError(
            f"output {name!r}: reference repo {repo!r} has no reference.revision and is not "
            f"one losslab maps from params alone; registered frameworks: {known}"
        )
    commit = commit if isinstance(commit, str) and len(commit) >= 7 else "0" * 40
    return Revision(
        text=f"{repo}@{commit}:{path}::{function} [golden output {name}]",
        repo=repo,
        commit=commit,
        path=path,
        function=function,
        kwargs=kwargs,
    )


def _resolved_for(data: Mapping[str, Any], name: str, out: Mapping[str, Any]) -> ResolvedReference:
    """The output's reference with the effective parameters it was computed with (the file's
    `params`, which record the executed commit's config defaults) over the revision's own."""
    ref = resolve_reference(_revision_for(data, name, out))
    params = out.get("params")
    if ref.framework.name not in _TEAM_FORMAT and isinstance(params, Mapping):
        ref = dataclasses.replace(ref, params={**ref.params, **dict(params)})
    return ref


def _ours(
    ref: ResolvedReference, fixture: Fixture, dtype: torch.dtype
) -> tuple[ReferenceResult, str]:
    """Recompute an output: with the `losslab.losses` configuration matching its framework
    (what the check is for), or, where no configuration can reproduce it, with losslab's
    re-derivation of the reference (labelled)."""
    fw = ref.framework
    config = fw.losslab_config(ref, fixture)
    if config.loss is not None:
        trained, valued = config_losses(config)
        value, _, _ = run_ours(valued, fixture, dtype)
        _, grads, kept = run_ours(trained, fixture, dtype)
        per_seq = [run_ours(valued, Fixture((seq,), None), dtype)[0] for seq in fixture.sequences]
        blocked = [~k & (s.loss_mask != 0) for k, s in zip(kept, fixture.sequences, strict=True)]
        result = ReferenceResult(value, per_seq, grads, blocked)
        return result, f"losslab.losses {valued.spec}"
    if fw.rederivation is None:
        raise ValueError(
            f"{ref.revision.short}: no losslab configuration reproduces it ({config.reason}) "
            "and losslab has no re-derivation of it"
        )
    return rederive(ref, fixture, dtype), f"losslab re-derivation ({config.reason})"


def _grad_rows(out: Mapping[str, Any], fixture: Fixture, name: str) -> list[np.ndarray]:
    rows = out.get("grad_current_logprobs")
    if not isinstance(rows, list) or len(rows) != len(fixture.sequences):
        raise GoldenFileError(
            f"output {name!r}: grad_current_logprobs must have one row per "
            f"sequence ({len(fixture.sequences)})"
        )
    arrays = [np.asarray(r, dtype=np.float64) for r in rows]
    for i, (a, s) in enumerate(zip(arrays, fixture.sequences, strict=True)):
        if a.shape != s.loss_mask.shape:
            raise GoldenFileError(
                f"output {name!r}: grad_current_logprobs[{i}] has {a.size} "
                f"values, sequence {i} has {s.loss_mask.size}"
            )
    return arrays


def _count(out: Mapping[str, Any]) -> tuple[int | None, bool]:
    """The golden clip/mask count, and whether it counts only tokens with A != 0."""
    for key in ("masked_token_count", "clipped_token_count"):
        if isinstance(out.get(key), int):
            return out[key], False
    if isinstance(out.get("masked_token_count_nonzero_adv"), int):
        return out["masked_token_count_nonzero_adv"], True
    return None, False


def check_output(
    data: Mapping[str, Any],
    name: str,
    fixture: Fixture,
    dtype: torch.dtype,
    loss_tol: float,
    grad_tol: float,
) -> OutputCheck:
    """Recompute one golden output with losslab's re-derivation and compare."""
    out = data["outputs"][name]
    try:
        ref = _resolved_for(data, name, out)
        ours, checked_with = _ours(ref, fixture, dtype)
    except (RevisionError, ValueError) as err:
        return OutputCheck(name, False, error=f"cannot map: {err}")
    label = f"{ref.revision.repo.split('/')[1]} {ref.loss_name} vs {checked_with}"
    try:
        golden_grad = _grad_rows(out, fixture, name)
        golden_loss = float(out["loss"])
    except (GoldenFileError, KeyError, TypeError, ValueError) as err:
        return OutputCheck(name, False, label, error=f"malformed output: {err}")
    scale = (out.get("float64_check") or {}).get("loss_term_abs_sum_float64")
    if not isinstance(scale, (int, float)) or scale <= 0:
        scale = loss_scale(ref, fixture, golden_loss, out.get("per_sequence_loss"))
    loss_err = abs(ours.loss - golden_loss) / max(scale, 1e-300)
    per_seq = out.get("per_sequence_loss")
    seq_err = (
        (
            float(np.max(np.abs(np.asarray(ours.per_sequence_loss) - np.asarray(per_seq))))
            / max(scale, 1e-300)
        )
        if isinstance(per_seq, list) and len(per_seq) == len(fixture.sequences)
        else 0.0
    )
    grad_err = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - b) / np.maximum(1.0, np.abs(b))))
        for a, b in zip(ours.grad_D, golden_grad, strict=True)
    )
    only_ours, only_golden = [], []
    for i, (mine_grad, g, s) in enumerate(
        zip(ours.grad_D, golden_grad, fixture.sequences, strict=True)
    ):
        # both sides inferred the same way: a loss token with A != 0 whose gradient is exactly
        # zero was clipped/masked (or, for SkyRL's guard, cut off)
        live = (s.loss_mask != 0) & (s.advantages != 0)
        theirs = live & (g == 0)
        mine = live & (np.asarray(mine_grad) == 0)
        only_ours += [(i, int(t)) for t in np.flatnonzero(mine & ~theirs)]
        only_golden += [(i, int(t)) for t in np.flatnonzero(theirs & ~mine)]
    count_golden, nonzero_only = _count(out)
    if nonzero_only:  # the golden count was inferred from exact-zero gradients: so is ours
        count_ours = sum(
            int(((s.loss_mask != 0) & (s.advantages != 0) & (np.asarray(g) == 0)).sum())
            for g, s in zip(ours.grad_D, fixture.sequences, strict=True)
        )
    else:
        count_ours = sum(int(b.sum()) for b in ours.blocked_D)
    passed = (
        loss_err <= loss_tol
        and seq_err <= loss_tol
        and grad_err <= grad_tol
        and not only_ours
        and not only_golden
        and (count_golden is None or count_golden == count_ours)
    )
    return OutputCheck(
        name,
        passed,
        label,
        "",
        loss_err,
        seq_err,
        grad_err,
        count_ours,
        count_golden,
        only_ours,
        only_golden,
    )


def loss_scale(
    ref: ResolvedReference, fixture: Fixture, loss: float, per_sequence: Any = None
) -> float:
    """The loss tolerance scale: the re-derivation's `loss_term_abs_sum` where losslab
    re-derives the reference, else max(1, |loss|, Σ|per-sequence loss|) (no larger than the sum
    of |token terms|, so the check is never looser)."""
    if ref.framework.rederivation is not None:
        return ref.framework.rederivation.loss_term_abs_sum(ref, fixture)
    per = np.abs(np.asarray(per_sequence, dtype=np.float64)).sum() if per_sequence else 0.0
    return float(max(1.0, abs(loss), per))


def check_golden(
    path: str | Path,
    loss_tolerance: float = DEFAULT_TOLERANCE,
    grad_tolerance: float = DEFAULT_TOLERANCE,
) -> GoldenReport:
    """Check every output of a golden file against losslab's re-derivations."""
    for label, tol in (("loss tolerance", loss_tolerance), ("gradient tolerance", grad_tolerance)):
        if not (isinstance(tol, (int, float)) and np.isfinite(tol) and tol >= 0):
            raise ValueError(f"{label} = {tol!r}; expected a finite number >= 0")
    data = read_golden(path)
    try:
        fixture = Fixture.from_json_sequences(data["sequences"])
    except ValueError as err:
        raise GoldenFileError(f"golden file {path}: {err}") from err
    regenerated = None
    if isinstance(data.get("generator"), Mapping):
        try:
            spec = FixtureSpec.from_generator_block(data["generator"])
            regenerated = generate_fixture(spec).sha256() == fixture.sha256()
        except (ValueError, TypeError):
            regenerated = False
    dtype_name = str((data.get("reference") or {}).get("dtype", "float32"))
    if dtype_name not in _DTYPES:
        raise GoldenFileError(
            f"golden file {path}: reference.dtype = {dtype_name!r}; expected "
            f"one of {sorted(_DTYPES)}"
        )
    outputs = [
        check_output(data, name, fixture, _DTYPES[dtype_name], loss_tolerance, grad_tolerance)
        for name in data["outputs"]
    ]
    return GoldenReport(
        str(path), outputs, fixture.sha256(), regenerated, loss_tolerance, grad_tolerance
    )


def _output_entry(
    ref: ResolvedReference, result: ReferenceResult, fixture: Fixture
) -> dict[str, Any]:
    loss_tok = sum(int((s.loss_mask != 0).sum()) for s in fixture.sequences)
    nonzero = sum(int(((s.loss_mask != 0) & (s.advantages != 0)).sum()) for s in fixture.sequences)
    blocked = sum(int(b.sum()) for b in result.blocked_D)
    blocked_nz = sum(
        int((b & (s.advantages != 0)).sum())
        for b, s in zip(result.blocked_D, fixture.sequences, strict=True)
    )
    rev = ref.revision
    all_tokens = {}
    if result.source["kind"] == "rederivation":  # pinned sets are inferred on A != 0 only
        all_tokens = {"masked_token_count": blocked, "mask_fraction": blocked / max(loss_tok, 1)}
    spindle_format = ref.framework.name == spindle.FRAMEWORK.name  # the team's format
    params = dict(ref.params["loss_config"] if spindle_format else ref.params)
    provenance = result.source.get("provenance") or provenance_of(result.source)
    return {
        "params": params,
        "reference": {
            "repo": rev.repo,
            "commit": result.source.get("commit", rev.commit),
            "path": rev.path,
            "function": rev.function,
            "revision": rev.text,
            "loss_name": ref.loss_name if spindle_format else None,
            "kind": result.source["kind"],
            "label": result.source["label"],
            "file_sha256": result.source.get("file_sha256"),
            "provenance": provenance["summary"],
        },
        "loss": result.loss,
        "token_count": loss_tok,
        "per_sequence_loss": result.per_sequence_loss,
        "grad_current_logprobs": [[float(x) for x in g] for g in result.grad_D],
        "masked_token_count_nonzero_adv": blocked_nz,
        "mask_fraction_nonzero_adv": blocked_nz / max(nonzero, 1),
        **all_tokens,
        "float64_check": {
            "loss_term_abs_sum_float64": loss_scale(
                ref, fixture, result.loss, result.per_sequence_loss
            )
        },
    }


def _fetched_or_rederived(
    ref: ResolvedReference, fixture: Fixture, text: str, allow_rederivation: bool, offline: bool
) -> ReferenceResult:
    """The pinned commit fetched into the cache and executed; else, only when allowed,
    losslab's re-derivation (labelled)."""
    from losslab.conformance.fetch import FetchError, fetch_pinned

    reason = ref.framework.unfetchable_reason
    if ref.framework.fetchable:
        try:
            files = fetch_pinned(ref.revision, offline=offline)
        except FetchError as err:
            reason = str(err)
        else:
            return run_pinned(ref, files, fixture)
    if not allow_rederivation or ref.framework.rederivation is None:
        raise RevisionError(
            f"revision {text!r}: no --source for {ref.revision.repo} and its pinned source "
            f"cannot be had ({reason}); name a checkout (or allow the re-derivation explicitly)"
        )
    result = rederive(ref, fixture)
    result.source["fallback_reason"] = reason
    return result


def make_golden(
    revisions: Sequence[str],
    sources: Mapping[str, Path],
    out: str | Path,
    spec: FixtureSpec | None = None,
    allow_rederivation: bool = False,
    names: Sequence[str] | None = None,
    offline: bool = False,
) -> dict[str, Any]:
    """Write a golden file with one output per revision, computed from pinned source.

    Args:
        revisions: revision strings (`owner/repo@commit:path::function(kw=value, ...)`).
        sources: {"owner/repo": checkout} to execute pinned source from; a repo not named here
            has its pinned commit fetched into losslab's cache (`losslab.conformance.fetch`).
        out: the file to write (atomically).
        spec: fixture generator parameters (default: set A).
        allow_rederivation: where the pinned source cannot be had, write losslab's
            re-derivation instead (labelled `kind: rederivation`) rather than failing.
        names: output names (default `<repo name>_<loss>`).
        offline: never fetch (cached commits are still used).
    """
    fixture = generate_fixture(spec)
    outputs: dict[str, Any] = {}
    used_sources: dict[str, Any] = {}
    if names is not None and len(names) != len(revisions):
        raise ValueError(f"names: got {len(names)} for {len(revisions)} revisions")
    for i, text in enumerate(revisions):
        ref = resolve_reference(parse_revision(text))
        checkout = sources.get(ref.revision.repo)
        if checkout is not None:
            result = run_pinned(ref, Path(checkout), fixture)
            ref = result.resolved or ref
        else:
            result = _fetched_or_rederived(ref, fixture, text, allow_rederivation, offline)
        name = (
            names[i]
            if names
            else (ref.revision.repo.split("/")[1].lower().replace("-", "_") + "_" + ref.loss_name)
        )
        base, k = name, 2
        while name in outputs:
            name, k = f"{base}_{k}", k + 1
        outputs[name] = _output_entry(ref, result, fixture)
        used_sources[ref.revision.repo] = {
            "commit": result.source.get("commit", ref.revision.commit),
            "path": ref.revision.path,
            "kind": result.source["kind"],
        }
    generator = fixture.spec.to_generator_block() if fixture.spec else {}
    generator["boundary_margins_float64"] = boundary_margins(fixture)
    data = {
        "description": f"losslab golden file: {fixture.description()}; normalization = sum over "
        "loss-mask tokens (Tinker)",
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "generator": generator,
        "conventions": {
            "normalization": "Tinker: loss = SUM over loss-mask tokens. Stable-RL run with "
            "loss_agg_mode='token-mean', global_batch_info={dp_size:1,"
            "batch_num_tokens:1} unless its params say otherwise.",
            "grad": "d loss / d current_logprobs, float32, per sequence, full length",
            "comparison": "compare in float64; loss error relative to "
            "float64_check.loss_term_abs_sum_float64, gradient error relative to "
            "max(1, |g|)",
        },
        "reference": {
            **{
                repo.split("/")[1].lower().replace("-", "_"): {"repo": repo, **v}
                for repo, v in used_sources.items()
            },
            "torch": torch.__version__,
            "device": "cpu",
            "dtype": "float32",
        },
        "sequences": fixture.to_json_dict()["sequences"],
        "outputs": outputs,
    }
    atomic_write_json(out, data, indent=1)
    return data

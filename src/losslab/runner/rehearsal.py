"""`losslab run PLAN --rehearse`: every phase of the user's exact plan at toy scale on the CPU.

A dress rehearsal catches crashes, wrong paths, missing data and shape errors before any GPU
hour is spent. It runs the plan's own task, data path, renderer, loss resolution, correctness
and restoration preflights, pilot, activation gate, feasibility, both arms, evaluation,
decision and report, changing only the scale:

- the model is a randomly initialised one of the plan's architecture: the base model's config
  (from a local directory or the Hugging Face cache) or, offline, the config class's defaults
  for its model type (`KNOWN_MODEL_TYPES`: `Qwen/Qwen3.5-2B` -> `qwen3_5`, whose text config
  is `Qwen3_5TextConfig`), shrunk by `tiny.shrink_config` (widths 32, one period of the layer
  pattern: 3 Gated-DeltaNet layers + 1 full-attention layer for Qwen3.5);
- the tokenizer is the model's own when it is on this machine, else the repo's offline
  byte-level ChatML tokenizer (`tiny.make_tiny_tokenizer`), and the report says which;
- `RehearsalScale`: a few rollout steps of a few small groups, short completions, a few
  evaluation items; LoRA rank, learning rate, losses, seeds and updates per batch are the plan's.

Everything it writes says REHEARSAL: the run directory's name, `REHEARSAL.txt`, the manifest's
`rehearsal` record, every check artifact's `REHEARSAL` field, each evaluation row, the verdict
(`evidence: false`) and the report's title and banner. A failed check does not stop it (the run
directory is created with `force`), because its purpose is to reach every phase; each check's
outcome is still recorded. A rehearsal run directory can never be resumed as a real run, nor a
real one as a rehearsal (`rundir.RunDir.open_for_resume`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import torch

from losslab.backends.executed import compare_config
from losslab.backends.local import LocalServiceClient
from losslab.backends.local.models import losslab_cache_dir
from losslab.checks import PhaseResult
from losslab.runner.components import DefaultComponents
from losslab.runner.errors import RunError
from losslab.runner.phases import VERDICT_PHASE
from losslab.runner.protocols import Phase, PhaseContext, Schedule
from losslab.stats.cost import plan_cost

REHEARSAL_NOTE = (
    "REHEARSAL: a toy-scale dress rehearsal on a randomly initialised model; it shows that "
    "every phase runs, and its numbers and verdict are NOT evidence about the hypothesis"
)

REHEARSAL_THREADS = 1

KNOWN_MODEL_TYPES: dict[str, str] = {
    "Qwen/Qwen3.5-2B": "qwen3_5",
    "HuggingFaceTB/SmolLM2-135M-Instruct": "llama",
}
"""transformers model type of plan base models whose config may be absent offline (source: the
`model_type` of each repo's published config.json; Qwen3.5 is the `qwen3_5` type of transformers
>= 5.2, whose language model is `Qwen3_5TextConfig`)."""


@dataclass(frozen=True)
class RehearsalScale:
    """How small the rehearsal is. The defaults finish the GSM8K plan in a few CPU minutes."""

    rollout_steps: int = 2
    """Rollout steps per arm (each with the plan's `updates_per_batch` optim steps)."""
    pilot_steps: int = 1
    """Pilot steps (the gate and feasibility run on them)."""
    groups_per_batch: int = 2
    group_size: int = 4
    """At least 2, so group-centred advantages are not all zero."""
    max_tokens: int = 24
    eval_max_tokens: int = 24
    eval_items: int = 8
    seed: int = 0
    """Seed of the random model weights."""


def rehearsal_config(
    base_model: str, own_config: Any | None, vocab_size: int, eos_id: int
) -> tuple[Any, str]:
    """The shrunk config of `base_model`'s architecture (its `own_config` when this machine has
    it, else its model type's defaults) and where that architecture came from."""
    from transformers import AutoConfig

    from losslab.backends.local.tiny import shrink_config

    config = own_config
    if config is not None:
        source = f"{base_model}'s own config (found on this machine), shrunk"
    else:
        model_type = KNOWN_MODEL_TYPES.get(base_model.partition("@")[0])
        if model_type is None:
            raise RunError(
                f"rehearsal: the config of {base_model!r} is not on this machine and its model "
                f"type is unknown offline (known: {sorted(KNOWN_MODEL_TYPES)}). Put its "
                f"config in the Hugging Face cache (`hf download {base_model} config.json`) "
                "or pass a local directory as base_model"
            )
        full = AutoConfig.for_model(model_type)
        config = full.get_text_config() if hasattr(full, "get_text_config") else full
        source = (
            f"offline: transformers' {type(config).__name__} defaults (model type "
            f"{model_type!r} of {base_model}), shrunk"
        )
    tiny = shrink_config(config, vocab_size=vocab_size)
    for key, value in dict(
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None, tie_word_embeddings=True
    ).items():
        setattr(tiny, key, value)
    return tiny, source


def build_rehearsal_model(base_model: str, cache: Path, seed: int = 0) -> dict[str, Any]:
    """Write (once; the folder name hashes the config) a random model of `base_model`'s
    architecture with the offline byte-level tokenizer, or the model's own tokenizer when it is
    on this machine. Returns what was built, for the manifest and the report."""
    from losslab.backends.local.tiny import make_tiny_tokenizer, save_random_model
    from losslab.stats.cost import local_config_and_tokenizer, params_from_config

    own_config, own_tokenizer = local_config_and_tokenizer(base_model)
    if own_tokenizer is not None and getattr(own_tokenizer, "chat_template", None):
        tokenizer, tok_note = own_tokenizer, f"{base_model}'s own tokenizer"
    else:
        tokenizer = make_tiny_tokenizer()
        tok_note = (
            "the offline byte-level ChatML tokenizer (losslab.backends.local.tiny; "
            f"{base_model}'s tokenizer is not on this machine)"
        )
    tokenizer.model_max_length = max(int(getattr(tokenizer, "model_max_length", 0) or 0), 1 << 16)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos_id = eos if isinstance(eos, int) and eos >= 0 else tokenizer.eos_token_id
    config, source = rehearsal_config(base_model, own_config, len(tokenizer), int(eos_id))
    digest = hashlib.sha256(
        json.dumps([config.to_dict(), tok_note, seed], sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    path = cache / f"{base_model.replace('/', '--').replace('@', '--')}-{digest}"
    if not (path / "config.json").is_file():
        save_random_model(path, config, tokenizer, seed=seed)
    return {
        "path": str(path),
        "architecture": source,
        "model_type": config.model_type,
        "layer_types": list(getattr(config, "layer_types", None) or []),
        "num_hidden_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "params": params_from_config(config),
        "tokenizer": tok_note,
        "weights": f"random (torch.manual_seed({seed}))",
    }


def shrink_plan(plan: Any, scale: RehearsalScale, local_model: str) -> Any:
    """The plan at toy scale: steps, groups, tokens and eval items from `scale`, the toy model
    as `engine.local_base_model`; every other field (losses, rank, lr, seeds, gate) unchanged."""
    upb = plan.updates_per_batch
    engine = plan.engine.model_copy(
        update={
            "group_size": scale.group_size,
            "groups_per_batch": scale.groups_per_batch,
            "max_tokens": scale.max_tokens,
            "eval_max_tokens": scale.eval_max_tokens,
            "pilot_steps": min(scale.pilot_steps, scale.rollout_steps),
            "local_base_model": local_model,
        }
    )
    return plan.model_copy(
        update={
            "steps": scale.rollout_steps * upb,
            "batch_size": scale.groups_per_batch * scale.group_size,
            "eval": plan.eval.model_copy(
                update={"n_examples": min(scale.eval_items, plan.eval.n_examples)}
            ),
            "engine": engine,
        }
    )


FEASIBILITY_NOTE = (
    "REHEARSAL: this projection scales the toy pilot's CPU timings to the toy schedule; "
    "the full plan's cost is `cost_projection` (FLOPs at an assumed utilisation), "
    "and a real run's pilot measures it. "
)


def _rehearsed(phase: Phase, ctx: PhaseContext) -> PhaseResult:
    """`phase` run as usual, its artifact (if it writes one) marked REHEARSAL; the verdict also
    says it is not evidence, in its record and in the log's verdict line."""
    result = phase.run(ctx)
    if phase.artifact is None:  # the pilot's and arms' rows and the evaluation mark themselves
        return result
    facts: dict[str, Any] = {"REHEARSAL": REHEARSAL_NOTE}
    if phase.name == "feasibility":
        facts["note"] = FEASIBILITY_NOTE + str(result.artifact.get("note", ""))
    if phase.name == VERDICT_PHASE:
        facts.update(evidence=False, rehearsal_verdict=result.artifact.get("verdict"))
        result = replace(result, summary=f"{result.summary} (REHEARSAL: toy model, not evidence)")
    return result.with_facts(**facts)


class RehearsalArmTrainer:
    """The default arm trainer, whose metrics rows (metrics.jsonl, checkpoints) say REHEARSAL;
    everything else (cursor, save, load, close, client, renderer) is the wrapped trainer's."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    def step(self, step: int) -> dict[str, Any]:
        return {"REHEARSAL": True, **self._trainer.step(step)}


class RehearsalComponents(DefaultComponents):
    """`DefaultComponents` on the toy-scale plan and model, on the CPU, marking every record."""

    def __init__(
        self,
        plan_file: Path,
        backend: str = "local",
        data: Path | None = None,
        scale: RehearsalScale | None = None,
        model_cache: Path | None = None,
        sources: dict[str, Path] | None = None,
    ) -> None:
        super().__init__(plan_file, "local", data, sources)  # a rehearsal always runs locally
        self.requested_backend = backend
        self.scale = scale or RehearsalScale()
        self.full_plan = self.plan
        cache = model_cache or (losslab_cache_dir() / "rehearsal")
        _ = self.task  # the plan's own task and data path: missing data stops here, not later
        self.model = build_rehearsal_model(self.full_plan.base_model, cache, self.scale.seed)
        self.plan = shrink_plan(self.full_plan, self.scale, self.model["path"])
        self.schedule = Schedule(
            arms=tuple(a.name for a in self.plan.arms),
            treatment=self.plan.arm_roles()["treatment"],
            steps=self.plan.rollout_steps,
            pilot_steps=self.plan.engine.pilot_steps,
            seeds={a.name: a.seed for a in self.plan.arms},
        )

    @property
    def rehearsal(self) -> dict[str, Any]:
        """The manifest's `rehearsal` record (its presence marks the run directory)."""
        return {
            "note": REHEARSAL_NOTE,
            "plan_base_model": self.full_plan.base_model,
            "backend_requested": self.requested_backend,
            "backend": "local (cpu)",
            "model": self.model,
            "scale": asdict(self.scale),
            "full_schedule": {
                "rollout_steps": self.full_plan.rollout_steps,
                "groups_per_batch": self.full_plan.engine.groups_per_batch,
                "group_size": self.full_plan.engine.group_size,
                "max_tokens": self.full_plan.engine.max_tokens,
                "eval_items": self.full_plan.eval.n_examples,
            },
            "cost_projection": self.cost_projection,
        }

    @cached_property
    def _cost(self) -> Any:
        """The full plan's projected cost (not the toy one), prompts measured on its task."""
        return plan_cost(self.full_plan, task=self.task)

    @cached_property
    def service(self) -> Any:
        return LocalServiceClient(device="cpu")

    def make_trainer(self, arm: str) -> RehearsalArmTrainer:
        return RehearsalArmTrainer(super().make_trainer(arm))

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The default table; every phase that writes an artifact marks it REHEARSAL."""
        return tuple(replace(p, run=partial(_rehearsed, p)) for p in super().phases)

    def cost_beside_pilot(self, wall_seconds: float, gpu_hours: float) -> dict[str, Any]:
        return self.cost_projection  # a toy pilot says nothing about the full plan's cost

    def executed_config(self, arm: str, trainer: Any) -> PhaseResult:
        # a row of the executed-config table (plan == executed, so it never fails the check)
        mark = "toy-scale rehearsal on a random model: not evidence"
        values = super().executed_config(arm, trainer).artifact
        compared = {k: v for k, v in values.items() if v["match"] is not None}
        reported = {k: v["executed"] for k, v in values.items() if v["match"] is None}
        rows = {"REHEARSAL": {"plan": mark, "executed": mark}, **compared}
        return compare_config(rows, arm, reported)

    def evaluate(self, arm: str, trainer: Any) -> PhaseResult:
        result = super().evaluate(arm, trainer)
        return replace(result, artifact=[{**row, "rehearsal": True} for row in result.artifact])

    def environment(self) -> dict[str, Any]:
        """Also pins torch to one thread for the run (the runner restores the caller's count
        afterwards and records this one for resume): a 32-wide model gains nothing from more,
        and on a loaded shared machine two OpenMP threads thrash (docs/benchmarks.md)."""
        torch.set_num_threads(REHEARSAL_THREADS)
        return {**super().environment(), "rehearsal": True, "device": "cpu (rehearsal)"}

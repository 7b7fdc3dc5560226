"""The plan file's schema: one pydantic model per block of the seed plan.

The models check types and required fields only (strict: `"100"` is not an integer). Rules that
relate fields to each other (arms differ in one switch, `steps` divisible by updates per batch,
gate bounds, loss names, ...) live in `losslab.plan.validate`, which reports every problem with its
JSON path at once. Fields this version does not know are kept (`extra="allow"`) and reported as
warnings. Free-text fields stay text.

Additions to the seed plan's vocabulary, all optional with the defaults the seed states in prose:
the top-level `engine` block (`EngineSettings`), the top-level `switch` (default `"loss"`), and per
arm `role`, `base_model` and a default of 1 for `updates_per_batch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from losslab.plan.loss_names import ResolvedLoss, resolve_loss
from losslab.tasks.registry import task_declaration


class PlanModel(BaseModel):
    """Base of every plan block: strict types, unknown fields kept (and warned about)."""

    model_config = ConfigDict(strict=True, extra="allow")


# --- vocabularies shared with the engine (kept here so that plan imports nothing of losslab) ---


@dataclass(frozen=True)
class GateMetric:
    """One metric the pilot measures and an activation-gate check may bound: where it comes from.

    The pilot (`losslab.engine.pilot_metrics`) reads this table; nothing else names the keys.

    Args:
        kind: what a value is (`fraction` in [0, 1], `nonnegative`, `count`, `name`).
        description: what it measures (plan check and the report show it).
        logged_key: the per-update metrics key it averages over the pilot steps (a loss's own
            metric such as `loss/clip_fraction`, or the engine's `policy/...`); for a step-level
            metric (`update=None`) the step row's key. None: not logged (`executed_base_model`
            is the name the training client reported).
        update: which minibatch update's record it reads: `last` (= updates_per_batch, the
            first update made after the policy moved away from the sampler) or None (step
            level).
        side_loss: the side loss (an arm role, `baseline`) evaluated on the treatment arm's
            batches without stepping, whose metric this is; None: the trained loss or the engine.
        reduce: `mean` over pilot steps, or `same` (every pilot step must agree, else NaN).
        logged_by: who logs `logged_key`: `loss` (the treatment arm's loss, or the `side_loss`
            arm's loss; plan check refuses a gate check on it unless that loss declares the key
            in its metrics), `engine` (`losslab.engine`'s own keys) or `backend` (no key).
    """

    kind: Literal["fraction", "nonnegative", "count", "name"]
    description: str
    logged_key: str | None = None
    update: Literal["last"] | None = "last"
    side_loss: str | None = None
    reduce: Literal["mean", "same"] = "mean"
    logged_by: Literal["loss", "engine", "backend"] = "engine"

    @property
    def loss_role(self) -> str | None:
        """The arm role whose loss must log `logged_key` (None: not a loss's metric)."""
        if self.logged_by != "loss":
            return None
        return self.side_loss or "treatment"


GATE_METRICS: dict[str, GateMetric] = {
    "dppo_masked_token_fraction": GateMetric(
        "fraction",
        "share of the loss tokens with A != 0 that the treatment loss's mask zeroed (its "
        "dppo/mask_fraction_nonzero_adv: A = 0 tokens left out, as Stable-RL's pg_clipfrac; "
        "the all-token share stays in metrics.jsonl as loss/clip_fraction) at the last "
        "minibatch update of each pilot step, mean over pilot steps",
        logged_key="dppo/mask_fraction_nonzero_adv",
        logged_by="loss",
    ),
    "policy_drift_abs_p_q90": GateMetric(
        "nonnegative",
        "90th percentile of |p_current - p_sampler| over loss tokens at the last update",
        logged_key="policy/drift_vs_sampler_q90",
    ),
    "grpo_clip_fraction": GateMetric(
        "fraction",
        "share of the loss tokens with A != 0 that the baseline ratio clip zeroed (its "
        "loss/clip_fraction_nonzero_adv, the DPPO mask fraction's denominator and Stable-RL's "
        "pg_clipfrac: A = 0 tokens are never clipped and carry no gradient), on the same pilot "
        "batches at the last minibatch update, mean over pilot steps",
        logged_key="loss/clip_fraction_nonzero_adv",
        side_loss="baseline",
        logged_by="loss",
    ),
    "executed_updates_per_batch": GateMetric(
        "count",
        "optim_step calls per rollout batch as logged",
        logged_key="optim/steps_executed",
        update=None,
        reduce="same",
    ),
    "executed_base_model": GateMetric(
        "name",
        "model name the backend reported at client creation",
        update=None,
        logged_by="backend",
    ),
}
"""The activation gate's vocabulary and sources. The pilot produces every key from this table;
plan check rejects a check on any other name, so a typo fails before a run, not after the pilot,
and a check on a loss's metric that the arm's loss does not declare (`logged_by="loss"`).
Adding a gate metric is one entry here (its logged key must be a metric some loss declares or
the engine logs)."""

EVAL_METRICS: dict[str, str] = {
    "accuracy": "correct",
    "reward": "reward",
    "format": "format",
}
"""Per-item evaluation metrics a decision criterion may name, mapped to the key of the per-item
evaluation record (a task's `Grade`) that holds the value."""

NOT_IMPLEMENTED_FEATURES: dict[str, str] = {
    "custom_optimizer": "losslab trains every arm with the plan's Adam optimizer",
    "checkpoint_restore": "losslab starts both arms from the base weights",
    "warmup_adaptation": "losslab has no warm-up adaptation phase",
    "generated_training_data": "losslab trains on the task's own problems",
    "learned_generator": "losslab has no learned data generator",
    "heldout_loss": "losslab evaluates with the task grader, not a held-out loss",
    "adaptive_selection": "losslab runs the pre-registered arms without adaptive selection",
}
"""`experiment_features` flags losslab does not implement: `true` on any is a plan error."""

IMPLEMENTED_FEATURES = ("custom_loss", "paired_comparison", "paired_training_arms")

ARM_ROLES = ("baseline", "treatment")


# --- blocks ---


class Dataset(PlanModel):
    name: str
    hf_path: str | None = None
    split: str | None = None
    n_examples: int | None = Field(default=None, gt=0)


class Optimizer(PlanModel):
    """The optimizer of both arms. `beta1`, `beta2`, `eps`, `weight_decay` are optional here: when
    absent they come from the restoration preflight's `optimizer_config`, else Tinker's
    `AdamParams` defaults (0.9, 0.95, 1e-12, 0.0)."""

    name: Literal["adam", "adamw"]
    lr: float = Field(gt=0)
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None


class Eval(PlanModel):
    benchmark: str
    metric: str
    n_examples: int = Field(gt=0)
    aggregation: str | None = None


class ExperimentFeatures(PlanModel):
    """Flags describing what the experiment needs. Those in `NOT_IMPLEMENTED_FEATURES` must be
    false: losslab refuses a plan it cannot run as written."""

    custom_loss: bool = True
    custom_optimizer: bool = False
    paired_comparison: bool = True
    paired_training_arms: bool = True
    checkpoint_restore: bool = False
    warmup_adaptation: bool = False
    generated_training_data: bool = False
    learned_generator: bool = False
    heldout_loss: bool = False
    adaptive_selection: bool = False


class Tolerance(PlanModel):
    atol: float
    rtol: float
    min_cosine: float | None = None


class Tolerances(PlanModel):
    baseline_loss: Tolerance | None = None
    baseline_gradient: Tolerance | None = None
    reference_loss: Tolerance | None = None
    reference_gradient: Tolerance | None = None


class PreflightPath(PlanModel):
    """One conformance path: our loss against a pinned baseline and a pinned reference.

    Revisions read `owner/repo@commit:path::function(kw=value, ...)`; the keyword part pins the
    loss hyperparameters (see `losslab.plan.loss_names`)."""

    id: str
    kind: str = "loss"
    baseline_revision: str | None = None
    reference_revision: str | None = None
    tolerances: Tolerances


class CorrectnessPreflight(PlanModel):
    required: bool = True
    status: str | None = None
    paths: list[PreflightPath] = Field(default_factory=list)


class GateCheck(PlanModel):
    """One activation-gate bound: `min <= value <= max`, or `value in one_of`."""

    metric: str
    measures: str | None = None
    min: float | None = None
    max: float | None = None
    one_of: list[Any] | None = None

    def bound_text(self) -> str:
        """The bound as one short text: `[0.001, 0.3]`, `>= 0.005`, `<= 1`, `one of [...]`."""
        if self.one_of is not None:
            return f"one of {self.one_of!r}"
        if self.min is not None and self.max is not None:
            return f"[{self.min:g}, {self.max:g}]"
        if self.min is not None:
            return f">= {self.min:g}"
        return f"<= {self.max:g}"


class ActivationGate(PlanModel):
    applicable: bool = True
    reason: str | None = None
    checks: list[GateCheck] = Field(default_factory=list)


class OptimizerConfig(PlanModel):
    learning_rate: float
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None
    weight_decay: float | None = None


class RestorationArm(PlanModel):
    name: str
    optimizer: str
    optimizer_config: OptimizerConfig


class RestorationGroup(PlanModel):
    arms: list[RestorationArm]


class RestorationPreflight(PlanModel):
    applicable: bool = True
    reason: str | None = None
    fixed_batch_required: bool = True
    groups: list[RestorationGroup] = Field(default_factory=list)


class Criterion(PlanModel):
    """One pre-registered comparison: the per-item weighted sum of arm metrics.

    `weights` maps an arm role (`treatment`, `baseline`) or an arm name to its weight; `bounds`
    are [low, high] of the per-item metric, from which the Hoeffding range follows."""

    id: str
    metric: str
    weights: dict[str, float]
    margin: float = 0.0
    bounds: list[float]


class DecisionRule(PlanModel):
    version: int = 1
    estimand: str | None = None
    unit: str | None = None
    seeds: list[int] = Field(default_factory=list)
    alpha: float
    method: Literal["paired_hoeffding"]
    criteria: list[Criterion] = Field(min_length=1)


class Arm(PlanModel):
    """One training arm. Arms may differ only in the plan's `switch` (default `loss`).

    `role` (optional) is `baseline` or `treatment`; by default the first arm is the baseline and the
    second the treatment. `base_model` (optional) must equal the plan's when given."""

    name: str
    loss: str
    seed: int
    lr: float = Field(gt=0)
    updates_per_batch: int = Field(default=1, ge=1)
    role: Literal["baseline", "treatment"] | None = None
    base_model: str | None = None


class Budget(PlanModel):
    gpu_hours: float | None = None
    max_wall_minutes: float | None = None


class GenerationAudit(PlanModel):
    required: bool = False
    answer_comparison: str | None = None
    min_sample_size: int | None = Field(default=None, ge=0)
    max_label_errors: int | None = Field(default=None, ge=0)
    max_eval_overlaps: int | None = Field(default=None, ge=0)


class FeasibilityCheck(PlanModel):
    """Projected cost against the budget, in the seed plan's `feasibility_check` form."""

    status: str = "unknown"
    problems: list[str] = Field(default_factory=list)
    wall_seconds: float | None = None
    gpu_hours: float | None = None
    known_gpu_hours: float = 0.0
    phases: dict[str, Any] = Field(default_factory=dict)


class EngineSettings(PlanModel):
    """Settings the engine needs that the seed plan states only in prose (optional block `engine`).

    Every field defaults to the value the seed plan's method text gives; `plan show` marks each
    value `plan` (set in the file) or `default`.
    """

    group_size: int = Field(default=8, ge=1)
    """Rollouts per prompt; advantages are centered within a group (GRPO)."""
    groups_per_batch: int = Field(default=32, ge=1)
    """Prompts per rollout step; `batch_size` must equal `groups_per_batch * group_size`."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature of training rollouts."""
    max_tokens: int = Field(default=512, ge=1)
    """Most new tokens per training rollout; must be below `max_seq_len`."""
    pilot_steps: int = Field(default=5, ge=1)
    """Rollout steps of the activation-gate pilot (treatment arm)."""
    eval_max_tokens: int = Field(default=512, ge=1)
    """Most new tokens per evaluation answer (greedy)."""
    eval_temperature: float = Field(default=0.0, ge=0)
    """Evaluation temperature; 0 is greedy decoding, as the seed plan's eval states."""
    task: str | None = None
    """Task name for `losslab.tasks`; `None` uses `dataset.name`."""
    task_config: dict[str, Any] = Field(default_factory=dict)
    """Extra task options (e.g. a reasoning-gym dataset's config)."""
    backend: str | None = None
    """Backend hint (a `losslab.backends.BACKENDS` name, checked when a run starts); `None`
    lets the command line choose. Not a switch between arms."""
    eval_every: int | None = Field(default=None, ge=1)
    """Efficiency endpoint: every `eval_every` rollout steps, score each arm's current weights
    greedily on the first `eval_every_items` test items, so the report draws accuracy against
    the training tokens spent and gives the area under that curve. `None` (the default) turns
    it off. Reported, never deciding: the decision rule's criteria are per-item metrics of the
    final checkpoints.

    When not to use it: when only the final verdict matters (it costs `eval_every_items` greedy
    answers per arm every `eval_every` steps; k = 5, m = 64 over 50 steps is 640 extra answers
    per arm, about half a full GSM8K evaluation); when the subset is too small to read (its
    standard error is about sqrt(p (1 - p) / m), 0.06 at m = 64 and p = 0.5, far wider than
    the gaps losses produce); and never to pick the arm, the step or the stopping point after
    looking at the curve (that is selection on the test set the verdict is computed on)."""
    eval_every_items: int = Field(default=64, ge=1)
    """Test items of each efficiency evaluation (the first ones, the same for every arm and
    step; capped at `eval.n_examples`)."""
    price_table: str | None = None
    """A JSON price table (the form of `losslab/stats/tinker_prices.json`: date, source, USD per
    million prefill / sample / train tokens by model) for the Tinker cost; `None` uses the
    bundled, dated one; a relative path is read from the plan file's folder. `plan show
    --prices` overrides both."""
    loss_path: Literal["custom", "builtin"] = "custom"
    """How the arms' losses reach the backend: `custom` (the client-side loss object through
    `forward_backward_custom`) or `builtin` (the backend's own built-in of the same name through
    `forward_backward(data, loss_fn, loss_fn_config)`; `losses.tinker_builtins` says which
    losses have one). The dispatch fingerprint checks the path on the backend before the pilot."""
    local_base_model: str | None = None
    """Model a backend that embeds its model (`Backend.executes_local_base_model`, e.g. the local
    CPU backend) runs instead of `base_model`, e.g. a small GGUF/HF model; the gate's
    `executed_base_model` check then accepts it too."""


class Plan(PlanModel):
    """A whole experiment plan; `load_plan` returns one only when validation found no error."""

    title: str
    hypothesis: str
    method: str | None = None
    base_model: str
    lora_rank: int = Field(gt=0)
    training_type: Literal["rl"]
    dataset: Dataset
    optimizer: Optimizer
    steps: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    max_seq_len: int = Field(gt=0)
    eval: Eval
    baseline: str | None = None
    experiment_features: ExperimentFeatures = Field(default_factory=ExperimentFeatures)
    correctness_preflight: CorrectnessPreflight | None = None
    activation_gate: ActivationGate | None = None
    restoration_preflight: RestorationPreflight | None = None
    success_criterion: str | None = None
    decision_rule: DecisionRule
    primary_endpoint: str | None = None
    arms: list[Arm]
    feasibility_required: bool = False
    feasibility: dict[str, Any] | None = None
    budget: Budget
    generation_audit: GenerationAudit | None = None
    command: str | None = None
    feasibility_check: FeasibilityCheck | None = None
    switch: str = "loss"
    """The one arm field the arms differ in (optional; default `loss`)."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """Engine settings the seed states only in prose (optional block)."""

    _warnings: list[str] = PrivateAttr(default_factory=list)
    _losses: dict[str, ResolvedLoss] = PrivateAttr(default_factory=dict)
    _base_dir: str | None = PrivateAttr(default=None)  # the plan file's folder (loss files)

    @property
    def warnings(self) -> list[str]:
        """Non-fatal findings of validation (unknown fields kept, prose that disagrees, ...)."""
        return list(self._warnings)

    # --- derived values the engine and report read ---

    def arm_roles(self) -> dict[str, str]:
        """Role -> arm name; the first arm is the baseline and the second the treatment unless
        the arms set `role`."""
        roles: dict[str, str] = {}
        for i, arm in enumerate(self.arms):
            roles[arm.role or ARM_ROLES[min(i, 1)]] = arm.name
        return roles

    def arm(self, key: str) -> Arm:
        """An arm by name or role."""
        name = self.arm_roles().get(key, key)
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"no arm named or playing {key!r}; arms: {[a.name for a in self.arms]}")

    @property
    def updates_per_batch(self) -> int:
        """Optim steps per rollout batch (equal across arms once validated)."""
        return self.arms[0].updates_per_batch

    @property
    def rollout_steps(self) -> int:
        """Rollout (sampling) steps per arm: `steps` counts optim steps."""
        return self.steps // self.updates_per_batch

    @property
    def task_name(self) -> str:
        return self.engine.task or self.dataset.name

    @property
    def task_needs_hub(self) -> bool:
        """Whether the task downloads from the hub: its registry line declares a hub dataset
        (`losslab.tasks.registry`) and `engine.task_config` names no `data` folder (a run's
        `--data` overrides both)."""
        declared = task_declaration(self.task_name)
        return (
            declared is not None and declared.needs_hub and not self.engine.task_config.get("data")
        )

    def loss(self, arm: str | Arm) -> ResolvedLoss:
        """An arm's loss as resolved once at load time (registry name, parameters, provenance).

        This value is the carrier: `losslab.conformance.arm_losses(plan)` builds the loss objects
        that the preflight checks and the arms train from it. `set_loss` replaces it.
        """
        arm_obj = arm if isinstance(arm, Arm) else self.arm(arm)
        if arm_obj.name not in self._losses:  # a Plan built without `load_plan`/`parse_plan`
            baseline_rev, reference_rev = self.loss_revisions()
            self._losses[arm_obj.name] = resolve_loss(
                arm_obj.loss, baseline_rev, reference_rev, base_dir=self._base_dir
            )
        return self._losses[arm_obj.name]

    def set_loss(self, arm: str | Arm, resolved: ResolvedLoss) -> None:
        """Replace an arm's resolved loss (tests use it to prove every consumer reads it)."""
        arm_obj = arm if isinstance(arm, Arm) else self.arm(arm)
        self._losses[arm_obj.name] = resolved

    def loss_spec(self, arm: str | Arm) -> str:
        """Display form of an arm's resolved loss (e.g. `ppo(clip_low_threshold=0.8, ...)`)."""
        return self.loss(arm).spec

    def loss_revisions(self) -> tuple[str | None, str | None]:
        """The baseline and reference revisions of the first `loss` conformance path."""
        if self.correctness_preflight is None:
            return None, None
        for path in self.correctness_preflight.paths:
            if path.kind == "loss":
                return path.baseline_revision, path.reference_revision
        return None, None

    def adam_config(self, arm: str | Arm) -> dict[str, float]:
        """Adam hyperparameters of an arm (learning_rate, beta1, beta2, eps, weight_decay)."""
        return {k: v for k, (v, _) in self.adam_config_sources(arm).items()}

    def adam_config_sources(self, arm: str | Arm) -> dict[str, tuple[float, str]]:
        """Adam hyperparameters with where each came from: `plan` (the arm or optimizer block),
        `restoration_preflight` (its optimizer_config) or `default` (Tinker's AdamParams)."""
        arm_obj = arm if isinstance(arm, Arm) else self.arm(arm)
        restored: OptimizerConfig | None = None
        if self.restoration_preflight is not None:
            for group in self.restoration_preflight.groups:
                for r_arm in group.arms:
                    if r_arm.name == arm_obj.name:
                        restored = r_arm.optimizer_config
        out: dict[str, tuple[float, str]] = {"learning_rate": (arm_obj.lr, "plan")}
        for key, default in ADAM_DEFAULTS.items():
            explicit = getattr(self.optimizer, key)
            if explicit is not None:
                out[key] = (explicit, "plan")
            elif restored is not None and getattr(restored, key) is not None:
                out[key] = (getattr(restored, key), "restoration_preflight")
            else:
                out[key] = (default, "default")
        return out

    def gate_for(self, executed_base_model: str | None = None) -> ActivationGate | None:
        """The activation gate as it applies to a run that executes `executed_base_model`.

        When a backend runs `engine.local_base_model` instead of `base_model` (an embedded
        small model), the `executed_base_model` check also accepts it; every other check is
        unchanged.
        """
        gate, local = self.activation_gate, self.engine.local_base_model
        if gate is None or local is None or executed_base_model != local:
            return gate
        checks = [
            c.model_copy(update={"one_of": [*c.one_of, local]})
            if c.metric == "executed_base_model" and c.one_of is not None and local not in c.one_of
            else c
            for c in gate.checks
        ]
        return gate.model_copy(update={"checks": checks})

    def gate_metrics(self) -> dict[str, GateMetric]:
        """The `GATE_METRICS` entries the activation gate's checks name, in check order: what
        the pilot measures and which side losses the treatment arm carries for it. Empty when
        the gate is absent or not applicable (a gate on another loss's metric needs nothing)."""
        gate = self.activation_gate
        if gate is None or not gate.applicable:
            return {}
        return {c.metric: GATE_METRICS[c.metric] for c in gate.checks}

    def engine_sources(self) -> dict[str, tuple[Any, str]]:
        """Each engine setting with `plan` (set in the file) or `default`."""
        set_fields = self.engine.model_fields_set
        return {
            name: (getattr(self.engine, name), "plan" if name in set_fields else "default")
            for name in EngineSettings.model_fields
        }


ADAM_DEFAULTS: dict[str, float] = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-12, "weight_decay": 0.0}
"""Tinker's `AdamParams` defaults (tinker 0.38.0), used when the plan names no value."""

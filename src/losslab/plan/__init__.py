"""losslab.plan: the experiment plan file, its validation and its summary.

```python
from losslab.plan import load_plan, PlanError
plan = load_plan("examples/gsm8k_dppo_vs_grpo.json")   # raises PlanError listing every problem
plan.loss_spec("treatment")     # 'dppo_binary_tv(low=0.15, high=0.15, anchor="sampler", clip_ratio_c=10)'
plan.engine.group_size          # 8 (default; the optional `engine` block overrides it)
```

Imports only pydantic and two stdlib-only registries (layering): the losses' declarations
(`losslab.losses.declarations`: names, parameter domains, metric keys) and the tasks' table
(`losslab.tasks.registry`: hub path, test size), so `losslab plan check` never imports torch.
`losslab.stats` and above import this package, never the reverse.
"""

from losslab.plan.loss_names import (
    LossNameError,
    ResolvedLoss,
    Revision,
    RevisionError,
    format_spec,
    parse_registry_spec,
    parse_revision,
    resolve_loss,
)
from losslab.plan.rule import hoeffding_half_width, weighted_range
from losslab.plan.schema import (
    ADAM_DEFAULTS,
    EVAL_METRICS,
    GATE_METRICS,
    NOT_IMPLEMENTED_FEATURES,
    ActivationGate,
    Arm,
    Budget,
    CorrectnessPreflight,
    Criterion,
    DecisionRule,
    EngineSettings,
    FeasibilityCheck,
    GateCheck,
    GateMetric,
    Plan,
)
from losslab.plan.summary import plan_summary
from losslab.plan.validate import (
    PlanCheck,
    PlanError,
    Problem,
    check_plan_data,
    check_plan_file,
    check_plan_text,
    load_plan,
    parse_plan,
)

__all__ = [
    "ADAM_DEFAULTS",
    "EVAL_METRICS",
    "GATE_METRICS",
    "NOT_IMPLEMENTED_FEATURES",
    "ActivationGate",
    "Arm",
    "Budget",
    "CorrectnessPreflight",
    "Criterion",
    "DecisionRule",
    "EngineSettings",
    "FeasibilityCheck",
    "GateCheck",
    "GateMetric",
    "LossNameError",
    "Plan",
    "PlanCheck",
    "PlanError",
    "Problem",
    "ResolvedLoss",
    "Revision",
    "RevisionError",
    "check_plan_data",
    "check_plan_file",
    "check_plan_text",
    "format_spec",
    "hoeffding_half_width",
    "load_plan",
    "parse_plan",
    "parse_registry_spec",
    "parse_revision",
    "plan_summary",
    "resolve_loss",
    "weighted_range",
]

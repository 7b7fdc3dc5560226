"""losslab.stats: the decision rule, the activation gate and feasibility, on top of `losslab.plan`.

```python
from losslab.stats import decide, evaluate_gate, project_feasibility, PairedOutcomes, StepTimings
verdict = decide(plan.decision_rule, PairedOutcomes.from_records({...}), plan=plan)
verdict.to_dict()     # the verdict record
```
"""

from losslab.stats.decision import (
    CriterionResult,
    PairedOutcomes,
    Verdict,
    decide,
    evaluate_criterion,
    verdict_line,
    verdict_word,
)
from losslab.stats.feasibility import StepTimings, feasibility_phase, project_feasibility
from losslab.stats.gate import check_bound, evaluate_gate
from losslab.stats.paired import (
    IntervalEstimate,
    McNemarResult,
    clopper_pearson,
    empirical_bernstein_ci,
    hoeffding_ci,
    mcnemar_exact,
    paired_t_ci,
)

__all__ = [
    "CriterionResult",
    "IntervalEstimate",
    "McNemarResult",
    "PairedOutcomes",
    "StepTimings",
    "Verdict",
    "check_bound",
    "clopper_pearson",
    "decide",
    "empirical_bernstein_ci",
    "evaluate_criterion",
    "evaluate_gate",
    "feasibility_phase",
    "hoeffding_ci",
    "mcnemar_exact",
    "paired_t_ci",
    "project_feasibility",
    "verdict_line",
    "verdict_word",
]

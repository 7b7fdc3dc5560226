"""losslab.conformance: is our loss the reference's loss, in value and gradient?

```python
from losslab.conformance import run_preflight, check_golden, generate_fixture, compare
report = run_preflight("examples/gsm8k_dppo_vs_grpo.json")            # re-derivations
report = run_preflight(plan, sources={"sail-sg/Stable-RL": "/src/Stable-RL"})  # pinned source
check_golden("tinker_ppo_and_dppo_seed0.json").passed
```

Module conformance of objective libraries (`losslab conform`) lives in `modules.py`.
"""

# --- loss preflight, pinned references, golden files ---
from losslab.conformance.fixtures import (  # noqa: F401
    Fixture,
    FixtureSequence,
    FixtureSpec,
    generate_fixture,
)
from losslab.conformance.golden import (  # noqa: F401
    GoldenFileError,
    GoldenReport,
    check_golden,
    make_golden,
)
from losslab.conformance.metrics import (  # noqa: F401
    ErrorMetrics,
    Tolerance,
    ToleranceCheck,
    check_tolerance,
    compare,
)

# (modules: module conformance, `losslab conform`)
from losslab.conformance.modules import ConformanceResult, conform_modules, load_module  # noqa: F401, E402, I001
from losslab.conformance.pinned import PinnedSourceError, parse_sources, run_pinned  # noqa: F401
from losslab.conformance.preflight import (  # noqa: F401
    Implementation,
    PreflightError,
    run_preflight,
    write_report,
)
from losslab.conformance.references import (  # noqa: F401
    ReferenceResult,
    ResolvedReference,
    rederive,
    resolve_reference,
)
from losslab.plan import Revision, RevisionError, parse_revision  # noqa: F401

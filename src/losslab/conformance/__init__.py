"""losslab.conformance: is our loss the reference's loss, in value and gradient?

```python
from losslab.conformance import run_preflight, check_golden, generate_fixture, compare
report = run_preflight("examples/gsm8k_dppo_vs_grpo.json")   # pinned source, fetched + cached
report = run_preflight(plan, sources={"sail-sg/Stable-RL": "/src/Stable-RL"})  # a checkout
report = run_preflight(plan, allow_rederivation=True)  # offline: labelled re-derivation
report["provenance"]["reference"]["summary"]   # "executed pinned source <repo>@<commit> (...)"
check_golden("tinker_ppo_and_dppo_seed0.json").passed
matrix = crosscheck()                          # every registered DPPO implementation, pairwise
```

Frameworks (one adapter module each, owning its re-derivation) live in `frameworks/`; adding one
is one module plus one line in `frameworks.FRAMEWORKS`.

Module conformance of objective libraries (`losslab conform`) lives in `modules.py`.
"""

# --- loss preflight, pinned references, golden files ---
from losslab.conformance.classify import classify  # noqa: F401
from losslab.conformance.crosscheck import crosscheck  # noqa: F401
from losslab.conformance.fetch import FetchError, fetch_pinned  # noqa: F401
from losslab.conformance.fixtures import (  # noqa: F401
    Fixture,
    FixtureSequence,
    FixtureSpec,
    generate_fixture,
    stress_spec,
)
from losslab.conformance.frameworks import (  # noqa: F401
    LOSS_FAMILIES,
    Framework,
    LosslabConfig,
    ReferenceResult,
    ResolvedReference,
    rederive,
    registry,
    resolve_reference,
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
from losslab.plan import Revision, RevisionError, parse_revision  # noqa: F401

"""Golden files made by executing the real sources (numbers only, no code), checked against the
`losslab.losses` configuration each framework adapter names.

Made with (one per framework; checkouts of each project's default branch at the commit named in
the file's `reference` block):

    losslab golden make --stress -r "<frameworks.<name>.example_revisions[0]>" \
        --source <owner/repo>=<checkout> -o tests/conformance/data/golden_<name>_stress.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.golden import check_golden

DATA = Path(__file__).with_name("data")
FRAMEWORKS = ("stable_rl", "verl", "skyrl", "prime_rl")


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_golden_from_real_source_passes(name: str) -> None:
    path = DATA / f"golden_{name}_stress.json"
    data = json.loads(path.read_text())
    (out,) = data["outputs"].values()
    assert out["reference"]["kind"] == "pinned_source"
    assert out["reference"]["provenance"].startswith("executed pinned source ")
    report = check_golden(path)
    assert report.passed, report.to_dict()
    assert report.generator_reproduces


def _grad(name: str) -> list[np.ndarray]:
    data = json.loads((DATA / f"golden_{name}_stress.json").read_text())
    (out,) = data["outputs"].values()
    return [np.asarray(g) for g in out["grad_current_logprobs"]]


def test_measured_guards_at_log_ratio_plus_22() -> None:
    # token (0, 20): sampler -25 -> current -3, A = +1.0204 (set A sequence 0)
    a = 1.0204156637191772
    assert _grad("stable_rl")[0][20] == pytest.approx(-a * 10.0, rel=1e-6)  # -A * c
    assert _grad("verl")[0][20] == pytest.approx(-a * 10.0, rel=1e-6)
    assert _grad("skyrl")[0][20] == 0.0  # clamp inside safe_exp_delta: no gradient
    # prime-rl: no guard, no cap: -A * e^22, plus 2 * kl_tau * 22 from its KL term
    assert _grad("prime_rl")[0][20] == pytest.approx(-a * np.exp(22.0) + 2e-3 * 22, rel=1e-5)


def test_a_wrong_cap_fails_the_real_verl_golden(tmp_path: Path) -> None:
    data = json.loads((DATA / "golden_verl_stress.json").read_text())
    (out,) = data["outputs"].values()
    out["params"]["clip_ratio_c"] = 20.0  # verl's code fallback instead of the executed 10
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    assert not check_golden(path).passed

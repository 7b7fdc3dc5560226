"""`plan check` accepts each of the field's losses (docs/losses.md) on a plan arm and refuses a
bad knob naming loss, key, value and expectation, from the declarations alone: one fresh
interpreter runs every case and reports whether torch was imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED_PLAN = REPO_ROOT / "examples" / "gsm8k_dppo_vs_grpo.json"

# (arm-0 loss, the refusal's expected tail or None for accepted)
CASES = [
    ("gspo(level=token, epsilon_low=0.2, epsilon_high=0.28)", None),
    ("gspo(level=sequence, log_ratio_guard=verl)", None),
    ("gspo(level=tokens)", "gspo: level='tokens' is not valid; expected one of sequence, token"),
    ("luspo(epsilon_high=0.0004)", None),
    ("cispo_eps(epsilon_meaning=one_plus_eps, epsilon_high=4.0)", None),
    ("cispo_eps(epsilon_high=5.0)", None),
    (
        "cispo_eps(epsilon_low=0.2)",
        "cispo_eps: epsilon_low=0.2 needs epsilon_meaning='one_plus_eps'; TRL's absolute cap "
        "(epsilon_meaning='absolute_cap') has no lower bound",
    ),
    ("dr_grpo(constant=max_seq_len, max_prompt_length=512, max_completion_length=1024)", None),
    ("dr_grpo(max_completion_length=0)", "dr_grpo: max_completion_length=0: expected a value >= 1"),
    ("dapo(clip_low=0.8, clip_high=1.28)", None),
    ("dapo(clip_low=1.3)", "dapo: clip_low_threshold=1.3 must be <= clip_high_threshold=1.28"),
    ("dual_clip_ppo(clip_ratio_c=3.0)", None),
    ("dual_clip_ppo(clip_ratio_c=1.0)", "dual_clip_ppo: clip_ratio_c=1.0: expected a value > 1"),
    ("icepop(low=0.2, high=5.0)", None),
    ("icepop(low=-1)", "icepop: low=-1: expected a value >= 0"),
    ("rollout_correction(level=sequence, mode=mask, lower=0.5, cap=2.0)", None),
    ("rollout_correction(mode=truncate, lower=0.5, cap=2.0)", None),
    (
        "rollout_correction(lower=3.0, cap=2.0)",
        "rollout_correction: lower=3.0 must be <= cap=2.0",
    ),
]

CASES += [
    ("sapo(tau_pos=1.0, tau_neg=1.05)", None),
    ("sapo(tau_neg=0)", "sapo: tau_neg=0: expected a value > 0"),
    ("gmpo(log_ratio_low=0.4, log_ratio_high=0.4)", None),
    ("kl_cov(kl_cov_ratio=0.002, kl_coef=1.0)", None),
    ("kl_cov(kl_cov_ratio=2)", "kl_cov: kl_cov_ratio=2: expected a value <= 1"),
    ("clip_cov(clip_cov_lb=1.0, clip_cov_ub=5.0)", None),
    ("clip_cov(clip_cov_lb=6.0)", "clip_cov: clip_cov_lb=6.0 must be <= clip_cov_ub=5.0"),
    ("m2po(tau=0.04)", None),
    ("m2po(tau=0)", "m2po: tau=0: expected a value > 0"),
    # the engine trains on sampler log-probs only: the recomputed ratio pair is refused
    (
        "icepop(anchor=recomputed, clip_low=0.8, clip_high=1.2)",
        "anchors on recomputed old log-probs, which the engine never computes; use anchor=sampler",
    ),
]

_PROBE = """
import json, sys
from losslab.plan import check_plan_data
data = json.loads(open(sys.argv[1], encoding="utf-8").read())
out = []
for loss in json.loads(sys.argv[2]):
    data["arms"][0]["loss"] = loss
    out.append([p.message for p in check_plan_data(data).errors if p.path == "arms[0].loss"])
print(json.dumps({"errors": out, "torch": "torch" in sys.modules}))
"""


def test_plan_check_reads_every_field_loss_without_torch() -> None:
    losses = [loss for loss, _ in CASES]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(SEED_PLAN), json.dumps(losses)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    for (loss, expected), errors in zip(CASES, result["errors"], strict=True):
        if expected is None:
            assert errors == [], loss
        else:
            assert len(errors) == 1 and errors[0].endswith(expected), (loss, errors)

"""Restoration preflight on two fresh local clients, and the failures it must catch."""

from __future__ import annotations

import json

from tinker import types

from losslab.backends.restoration import (
    check_restoration,
    restoration_phase,
    restoration_preflight,
)

from .conftest import rl_batch

# The plan's two arms (shared/seeds/experiment_plan.json, restoration_preflight.groups[0]).
PLANNED = {"learning_rate": 2e-05, "beta1": 0.9, "beta2": 0.95, "eps": 1e-08}
ARMS = [
    {"name": "grpo_seed0", "optimizer": "adam", "optimizer_config": PLANNED},
    {"name": "dppo_seed0", "optimizer": "adam", "optimizer_config": PLANNED},
]


def test_two_fresh_local_clients_pass(service, tiny_llama):
    report = restoration_preflight(service, base_model=tiny_llama, rank=4, seed=0, arms=ARMS)
    json.dumps(report)  # JSON-able for restoration.json
    assert report["passed"], report["problems"]
    assert report["logprobs"]["bitwise_equal"] is True
    assert report["logprobs"]["max_abs_diff"] == 0.0
    assert report["logprobs"]["num_sequences"] == 4 and report["logprobs"]["num_tokens"] > 100
    assert [o["actual"]["learning_rate"] for o in report["optimizers"]] == [2e-05, 2e-05]


def test_preflight_catches_a_trained_arm_and_a_wrong_optimizer(service, tiny_llama):
    good = service.create_lora_training_client(
        tiny_llama, rank=4, seed=0, adam_params=types.AdamParams(**PLANNED)
    ).result()
    stepped = service.create_lora_training_client(
        tiny_llama, rank=4, seed=0, adam_params=types.AdamParams(**PLANNED)
    ).result()
    stepped.forward_backward(rl_batch(0), "importance_sampling").result()
    stepped.optim_step().result()  # uses the configured (planned) AdamParams
    stepped.forward_backward(rl_batch(0), "importance_sampling").result()
    stepped.optim_step().result()
    report = check_restoration({"grpo_seed0": good, "dppo_seed0": stepped}, ARMS)
    assert not report["passed"]
    assert report["logprobs"]["max_abs_diff"] > 1e-6
    assert any("dppo_seed0: log-probs differ" in p for p in report["problems"])

    default_opt = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    report = check_restoration({"grpo_seed0": good, "dppo_seed0": default_opt}, ARMS)
    assert not report["passed"] and report["logprobs"]["bitwise_equal"]
    assert any("learning_rate is 0.0001, planned 2e-05" in p for p in report["problems"])
    assert any("eps is 1e-12, planned 1e-08" in p for p in report["problems"])


def test_phase_rows_and_the_one_seed_check(service, tiny_llama):
    result = restoration_phase(service, base_model=tiny_llama, rank=4, seeds=[0, 1], arms=ARMS)
    assert [c.name for c in result.checks] == [
        "log-probs dppo_seed0 vs grpo_seed0 (fixed batch)",
        "log-probs finite (fixed batch)",
        "optimizer grpo_seed0",
        "optimizer dppo_seed0",
        "arm seeds",
    ]
    # fresh clients from the smaller seed agree bitwise; only the two planned seeds fail
    assert result.checks[0].measured == 0.0 and result.checks[0].note == "bitwise equal"
    assert result.failures == (result.checks[-1],) and result.checks[-1].measured == [0, 1]
    assert result.record()["setup"]["seed"] == 0 and result.record()["passed"] is False
    assert restoration_phase(service, base_model=tiny_llama, rank=4, seeds=[0, 0], arms=ARMS).passed

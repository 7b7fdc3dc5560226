"""Cost projection from the plan alone: every number re-derived by hand from the plan's values."""

from __future__ import annotations

from pathlib import Path

import pytest

from losslab.plan import load_plan
from losslab.stats.cost import (
    GPU_CLASSES,
    KNOWN_SIZES,
    ModelSize,
    PromptLengths,
    measure_prompt_lengths,
    model_size,
    params_from_config,
    plan_cost,
    project_cost,
)
from losslab.stats.feasibility import StepTimings, project_feasibility

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def test_flops_and_times_by_hand():
    plan = load_plan(SEED_PLAN)  # 32 groups x 8, max_tokens 512, eval 1319 x 512, 2 updates
    n, lp = 1e9, 100.0
    cost = project_cost(plan, ModelSize("m", n, "test", True), PromptLengths(lp, 1, "test"))
    assert cost.flops["sampling_per_step"] == 2 * n * (32 * 100 + 256 * 512)
    assert cost.flops["training_per_step"] == 4 * n * 256 * (100 + 512)
    assert cost.flops["eval_per_item"] == 2 * n * (100 + 512)
    h100 = GPU_CLASSES["H100-SXM"]
    # sampling is bandwidth-bound: 4 decode batches of 64 rows, each reading the 2 GB of bf16
    # weights once for the prefill and once per decoded token
    mem_s = 4 * 513 * (2 * n) / (h100.hbm_tb_per_s * 1e12 * 0.25)
    assert cost.seconds_per["sample_s"] == pytest.approx(mem_s)
    train_s = 4 * n * 256 * 612 / (h100.bf16_tflops * 1e12 * 0.25)
    assert cost.seconds_per["train_per_rollout_step_s"] == pytest.approx(train_s)
    # the same arithmetic as the pilot's measured projection
    fc = project_feasibility(
        StepTimings(
            cost.seconds_per["sample_s"],
            train_s / 2,
            cost.seconds_per["eval_s_per_item"],
            pilot_reused=True,
        ),
        plan,
    )
    assert cost.wall_seconds == pytest.approx(fc.wall_seconds)
    assert cost.gpu_hours == pytest.approx(fc.gpu_hours)
    assert (cost.budget_gpu_hours, cost.budget_wall_minutes) == (2.0, 120)
    total = 2 * (50 * (cost.flops["sampling_per_step"] + cost.flops["training_per_step"]))
    assert cost.flops["total"] == pytest.approx(total + 2 * 1319 * cost.flops["eval_per_item"])


def test_over_budget_is_reported():
    plan = load_plan(SEED_PLAN)
    big = ModelSize("big", 70e9, "test", True)
    cost = project_cost(plan, big, PromptLengths(150, 1, "test"), gpu="A100-80GB")
    assert cost.status == "fail"
    assert any("exceeds budget.gpu_hours 2" in p for p in cost.problems)
    assert any("FAIL" in line for line in cost.lines())


def test_parameter_count_from_config(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from losslab.backends.local.tiny import tiny_config

    dense = tiny_config("qwen3_5", vocab_size=259, eos_id=258)
    model = AutoModelForCausalLM.from_config(dense)
    # tied embedding: the lookup is free, the output matmul counts once -> every weight once
    assert params_from_config(dense) == sum(p.numel() for p in model.parameters())
    moe = tiny_config("qwen3_5_moe", vocab_size=259, eos_id=258)
    model = AutoModelForCausalLM.from_config(moe)
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total = sum(p.numel() for p in model.parameters())
    assert routed > 0 and params_from_config(moe) == total - routed + routed * 2 / 4
    del torch


def test_known_sizes_and_unknown_model():
    assert model_size("Qwen/Qwen3.5-2B").params == 2.0e9
    assert "nominal" in KNOWN_SIZES["Qwen/Qwen3.5-2B"].source
    with pytest.raises(ValueError, match="size unknown offline"):
        model_size("some-org/unknown")


def test_prompt_lengths_are_measured_on_the_task():
    from losslab.backends.local.tiny import make_tiny_tokenizer
    from losslab.tasks import make_task
    from losslab.tasks.base import ChatRenderer

    task = make_task("arithmetic", seed=0)
    tok = make_tiny_tokenizer()
    got = measure_prompt_lengths(task, tok, items=10)
    renderer = ChatRenderer(tok)
    want = [len(renderer.build_prompt(task.messages(p)).to_ints()) for p in task.train[:10]]
    assert got.mean_tokens == sum(want) / 10 and got.items == 10
    est = measure_prompt_lengths(task, None, items=10)  # no tokenizer: characters / 4
    chars = [len(renderer.prompt_text(task.messages(p))) for p in task.train[:10]]
    assert est.mean_tokens == pytest.approx(sum(chars) / 10 / 4.0)
    assert "characters / 4" in est.how


def test_plan_cost_measures_gsm8k_prompts(shared_dir):
    plan = load_plan(SEED_PLAN)
    measured = plan_cost(plan, data=shared_dir / "gsm8k")
    assert measured.prompt.items == 256 and 50 < measured.prompt.mean_tokens < 512
    bound = plan_cost(plan, data=None)  # no data: the plan's bound max_seq_len - max_tokens
    assert bound.prompt.mean_tokens == 1024 - 512 and "not measured" in bound.prompt.how


def test_plan_show_prints_the_projection_against_the_budget():
    from typer.testing import CliRunner

    from losslab.cli import app

    out = CliRunner().invoke(app, ["plan", "show", str(SEED_PLAN)])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "Cost projection (local backend, 1 x NVIDIA H100 SXM 80GB" in text
    assert "(budget 120)" in text and "(budget 2)" in text and "GPU-hours" in text

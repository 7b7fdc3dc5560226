"""Cost projection from the plan alone: every number re-derived by hand from the plan's values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from losslab.plan import load_plan
from losslab.stats.cost import (
    CPU_CALIBRATION,
    GPU_CLASSES,
    KNOWN_SIZES,
    ModelSize,
    PromptLengths,
    calibration_from_bench,
    measure_prompt_lengths,
    model_size,
    params_from_config,
    plan_cost,
    project_cost,
    training_path,
)
from losslab.stats.feasibility import StepTimings, project_feasibility

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_flops_and_times_by_hand():
    plan = load_plan(SEED_PLAN)  # 32 groups x 8, max_tokens 512, eval 1319 x 512, 2 updates
    n, lp = 1e9, 100.0
    # an architecture-less size: 2N per token, no prefix sharing
    cost = project_cost(plan, ModelSize("m", n, "test", True), PromptLengths(lp, 1, "test"))
    assert cost.flops["sampling_per_step"] == 2 * n * (32 * 100 + 256 * 512)
    # 256 x 612 tokens, 78,336 per minibatch > the 32,768-token CUDA micro-batch: two-phase,
    # three matmul passes (no-grad forward, forward with grad, activation backward) = 6N
    assert "two-phase (6N)" in cost.training_path
    assert cost.flops["training_per_step"] == 6 * n * 256 * (100 + 512)
    assert cost.flops["eval_per_item"] == 2 * n * (100 + 512)
    h100 = GPU_CLASSES["H100-SXM"]
    # sampling is bandwidth-bound: 4 decode batches of 64 rows, each reading the 2 GB of bf16
    # weights once for the prefill and once per decoded token
    mem_s = 4 * 513 * (2 * n) / (h100.hbm_tb_per_s * 1e12 * 0.25)
    assert cost.seconds_per["sample_s"] == pytest.approx(mem_s)
    train_s = 6 * n * 256 * 612 / (h100.bf16_tflops * 1e12 * 0.25)
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
    # two arms' final checkpoints and the base model: three evaluations of 1319 items
    assert cost.flops["total"] == pytest.approx(total + 3 * 1319 * cost.flops["eval_per_item"])


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
    from losslab.backends.local.models import public_config

    # Qwen3.5-2B: counted on its bundled published config (text model, tied embeddings)
    size = model_size("Qwen/Qwen3.5-2B")
    assert size.exact and "published config" in size.source
    assert size.params == params_from_config(public_config("Qwen/Qwen3.5-2B"))
    assert 1.8e9 < size.params < 2.0e9  # the "2B" of the name counts the vision tower too
    assert model_size("HuggingFaceTB/SmolLM2-135M-Instruct") is KNOWN_SIZES[SMOLLM2]
    with pytest.raises(ValueError, match="size unknown offline"):
        model_size("some-org/unknown")


def test_hybrid_architecture_flops_by_hand():
    """Qwen3.5-2B's published config: 18 Gated-DeltaNet layers (16 value heads, key/value
    dims 128) and 6 full-attention layers (8 heads of 256); every group's prompt trained once."""
    plan = load_plan(SEED_PLAN)
    size = model_size("Qwen/Qwen3.5-2B")
    arch, n, lp = size.architecture, size.params, 100.0
    assert (arch.linear_attention_layers, arch.full_attention_layers) == (18, 6)
    assert arch.shares_prefix and arch.family == "qwen3_5"
    cost = project_cost(plan, size, PromptLengths(lp, 1, "test"))
    # delta rule per token and value head, chunk 64: 4*64*128 + 64*256 + 2*64*128 + 6*128^2
    chunked, decode = 163_840, 6 * 128 * 128
    width = 8 * 256

    def attention(context_sum):  # 6 layers, 4 FLOPs per (query, key, width) triple
        return 6 * 4 * width * context_sum

    prompt_ctx = 100 * 101 / 2  # keys seen by a 100-token prompt
    completion_ctx = 512 * 100 + 512 * 513 / 2  # by 512 tokens decoded after it
    sampling = 2 * n * (32 * 100) + attention(32 * prompt_ctx) + 18 * 16 * chunked * 32 * 100
    sampling += 2 * n * 256 * 512 + attention(256 * completion_ctx) + 18 * 16 * decode * 256 * 512
    assert cost.flops["sampling_per_step"] == pytest.approx(sampling, rel=1e-12)
    # the trie: 32 prompts once + 256 completions = 134,272 tokens, 67,136 per minibatch: 6N
    tokens = 32 * 100 + 256 * 512
    cores = attention(32 * prompt_ctx + 256 * completion_ctx) + 18 * 16 * chunked * tokens
    assert "two-phase (6N)" in cost.training_path
    assert cost.flops["training_per_step"] == pytest.approx(6 * n * tokens + 4 * cores, rel=1e-12)


def test_training_path_switches_at_the_micro_batch():
    assert training_path(4096, 4096)[0] == 2  # fits: fused, forward + backward (4N)
    assert training_path(4097, 4096)[0] == 3  # over: two-phase (6N)


def test_cpu_calibration_is_the_bench_measurement():
    """Each `CPU_CALIBRATION` entry re-derived from the bench JSON it cites: the FLOPs of the
    measured step (this module's model) over the measured matmul rate and phase medians."""
    bench = Path(__file__).resolve().parents[2] / "bench"

    sys.path.insert(0, str(bench))
    from bench_models import qwen3_5_config, smollm2_dir

    from losslab.backends.local.models import ModelNotFoundError

    try:  # the bench model's config is SmolLM2's widths (bench/bench_models.py)
        qwen = qwen3_5_config(smollm2_dir())
    except ModelNotFoundError as e:
        pytest.skip(f"SmolLM2's config is not on this machine: {e}")
    runs = {
        "llama": (bench / "results_vs_trl.json", model_size(SMOLLM2)),
        "qwen3_5": (bench / "results_vs_trl_qwen3_5.json", model_size("bench-qwen3_5", qwen)),
    }
    for family, (path, size) in runs.items():
        cal = CPU_CALIBRATION[family]
        assert path.name in cal.source
        got = calibration_from_bench(json.loads(path.read_text()), size.architecture, size.params)
        assert got.sampling_fraction == pytest.approx(cal.sampling_fraction, abs=5e-4)
        assert got.training_fraction == pytest.approx(cal.training_fraction, abs=5e-4)
        assert got.matmul_gflops == pytest.approx(cal.matmul_gflops, abs=0.05)


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

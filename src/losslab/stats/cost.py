"""Cost projection from the plan alone: FLOPs, wall time and GPU-hours before anything runs.

Per rollout step, with P = groups_per_batch prompts, G = group_size samples, prompt length L_p
(mean, measured on the task's training prompts), completion length L_c = max_tokens (an upper
bound: every completion runs to its cap), N = parameters used per token (for a MoE model, the
active ones), U = updates_per_batch:

    sampling  F_s = 2 N (P L_p + P G L_c)          prefill once per group + one decode per token
    training  F_t = 4 N P G (L_p + L_c)            LoRA: forward 2N + activation gradients 2N per
                                                   token (frozen base weights get no gradient);
                                                   the U minibatches together cover the batch once
    eval      F_e = 2 N n_eval (L_p + L_eval)      greedy, L_eval = eval_max_tokens (upper bound)

Attention-score FLOPs (~ 4 L d per token and full-attention layer) are left out: with contexts
of at most `max_seq_len` = 1024 they are a few percent of 2N for a 2B model, and only one layer
in four of Qwen3.5 has full attention. Each phase's time is a roofline: the larger of its FLOPs
at `utilisation` x the GPU's dense bf16 peak and its weight reads at `utilisation` x the GPU's
memory bandwidth (decoding reads every weight once per token step of a batch of
`rows_per_decode_batch` sequences: the local backend's `max_batch_rows` = 64). The times go
through `stats.feasibility.project_feasibility`, the same arithmetic the pilot's measured
projection uses, so the two are comparable line by line.

The utilisation is an assumption, stated with every projection; the pilot's measured step
times replace it once a real run starts (`feasibility.json`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from losslab.plan import Plan
from losslab.stats.feasibility import StepTimings, project_feasibility


@dataclass(frozen=True)
class GpuClass:
    """A named accelerator: dense bf16 tensor peak and HBM bandwidth (vendor datasheet)."""

    name: str
    bf16_tflops: float
    hbm_tb_per_s: float
    source: str


GPU_CLASSES: dict[str, GpuClass] = {
    "H100-SXM": GpuClass(
        "NVIDIA H100 SXM 80GB", 989.0, 3.35, "NVIDIA H100 datasheet (dense BF16, no sparsity)"
    ),
    "H200": GpuClass("NVIDIA H200 141GB", 989.0, 4.8, "NVIDIA H200 datasheet (dense BF16)"),
    "A100-80GB": GpuClass(
        "NVIDIA A100 SXM 80GB", 312.0, 2.039, "NVIDIA A100 datasheet (dense BF16)"
    ),
}
DEFAULT_GPU = "H100-SXM"
DEFAULT_UTILISATION = 0.25
"""Assumed fraction of peak FLOP/s and bandwidth the local backend reaches (transformers eager,
no fused kernels, bf16). An assumption, not a measurement: the pilot measures the real one."""

DEFAULT_CHARS_PER_TOKEN = 4.0
"""Characters per token used when the model's tokenizer is not on this machine (typical of
English text under the ~150k-250k-entry BPE vocabularies of Qwen models); stated as such."""


@dataclass(frozen=True)
class ModelSize:
    """Parameters per token of a base model and where the number comes from."""

    name: str
    params: float
    source: str
    exact: bool


KNOWN_SIZES: dict[str, ModelSize] = {
    "Qwen/Qwen3.5-2B": ModelSize(
        "Qwen/Qwen3.5-2B",
        2.0e9,
        "nominal: the '2B' of the published model name (total parameters of the released "
        "checkpoint, vision encoder included); the exact text-model count needs its config "
        "(`hf download Qwen/Qwen3.5-2B config.json`), which this machine does not have",
        False,
    ),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelSize(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        134_515_008,
        "counted on the dequantized GGUF (shared/specs/local_model_measurements.md)",
        True,
    ),
}


def params_from_config(config: Any) -> float:
    """Parameters per token of a causal LM built from `config`, counted on the meta device (no
    memory): all weights except the input embedding (a lookup, no FLOPs); a tied unembedding
    counts once, as the output matmul. For MoE layers only `num_experts_per_tok` of
    `num_experts` routed experts count."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = 0.0
    experts = getattr(config, "num_experts", None) or 0
    active = getattr(config, "num_experts_per_tok", None) or experts
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    for name, p in model.named_parameters():
        if p is embed and not tied:
            continue
        n = float(p.numel())
        if experts and ".experts." in f".{name}." and p.dim() >= 3 and p.shape[0] == experts:
            n *= active / experts
        total += n
    return total


def model_size(base_model: str, config: Any | None = None) -> ModelSize:
    """The size of `base_model`: exact from `config` when given, else the `KNOWN_SIZES` table."""
    if config is not None:
        return ModelSize(base_model, params_from_config(config), "counted from its config", True)
    known = KNOWN_SIZES.get(base_model.partition("@")[0])
    if known is None:
        raise ValueError(
            f"base_model {base_model!r}: size unknown offline; pass its config (a local "
            f"directory or the Hugging Face cache), or add it to losslab.stats.cost.KNOWN_SIZES"
        )
    return known


@dataclass(frozen=True)
class PromptLengths:
    """Mean prompt length in tokens over the measured items, and how it was measured."""

    mean_tokens: float
    items: int
    how: str


@dataclass
class CostProjection:
    """FLOPs and times of the plan on one GPU class, and the budget comparison."""

    model: ModelSize
    gpu: GpuClass
    utilisation: float
    prompt: PromptLengths
    flops: dict[str, float]
    seconds_per: dict[str, float]
    wall_seconds: float
    gpu_hours: float
    budget_gpu_hours: float | None
    budget_wall_minutes: float | None
    status: str
    problems: list[str]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The projection as `plan show` prints it."""
        f, t = self.flops, self.seconds_per
        budget_h = "-" if self.budget_gpu_hours is None else f"{self.budget_gpu_hours:g}"
        budget_m = "-" if self.budget_wall_minutes is None else f"{self.budget_wall_minutes:g}"
        size = f"{self.model.params / 1e9:.3g}B params/token ({self.model.source})"
        return [
            f"Cost projection (local backend, 1 x {self.gpu.name}, bf16, "
            f"{self.utilisation:.0%} of peak assumed)",
            f"  model      {size}",
            f"  prompts    {self.prompt.mean_tokens:.0f} tokens mean ({self.prompt.how})",
            f"  per rollout step  sampling {f['sampling_per_step']:.3g} FLOP = "
            f"{t['sample_s']:.3g} s; training {f['training_per_step']:.3g} FLOP = "
            f"{t['train_per_rollout_step_s']:.3g} s",
            f"  per eval item     {f['eval_per_item']:.3g} FLOP = {t['eval_s_per_item']:.3g} s",
            f"  total             {f['total']:.3g} FLOP",
            f"  projected  {self.wall_seconds / 60:.3g} wall minutes (budget {budget_m}), "
            f"{self.gpu_hours:.3g} GPU-hours (budget {budget_h}): {self.status.upper()}",
            *[f"  problem    {p}" for p in self.problems],
            "  assumes    " + "; ".join(self.assumptions),
        ]


def _roofline_s(flops: float, weight_bytes: float, gpu: GpuClass, utilisation: float) -> float:
    compute = flops / (gpu.bf16_tflops * 1e12 * utilisation)
    memory = weight_bytes / (gpu.hbm_tb_per_s * 1e12 * utilisation)
    return max(compute, memory)


def project_cost(
    plan: Plan,
    model: ModelSize,
    prompt: PromptLengths,
    *,
    gpu: str = DEFAULT_GPU,
    utilisation: float = DEFAULT_UTILISATION,
    rows_per_decode_batch: int = 64,
    bytes_per_param: float = 2.0,
) -> CostProjection:
    """Project the plan's FLOPs, wall time and GPU-hours (formulas: module docstring)."""
    if gpu not in GPU_CLASSES:
        raise ValueError(f"gpu {gpu!r}: expected one of {sorted(GPU_CLASSES)}")
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation = {utilisation}; expected a fraction in (0, 1]")
    g = GPU_CLASSES[gpu]
    e = plan.engine
    n, p_groups, group, lp = model.params, e.groups_per_batch, e.group_size, prompt.mean_tokens
    lc, upb = e.max_tokens, plan.updates_per_batch
    rows = p_groups * group
    weights = n * bytes_per_param
    sample_flops = 2 * n * (p_groups * lp + rows * lc)
    train_flops = 4 * n * rows * (lp + lc)
    eval_flops = 2 * n * (lp + e.eval_max_tokens)
    decode_batches = math.ceil(rows / rows_per_decode_batch)
    # weight reads: one prefill pass per decode batch plus one pass per decoded token step
    sample_s = _roofline_s(sample_flops, weights * decode_batches * (1 + lc), g, utilisation)
    train_s = _roofline_s(train_flops, weights * 2 * upb, g, utilisation)
    eval_batches = math.ceil(plan.eval.n_examples / rows_per_decode_batch)
    eval_total_s = _roofline_s(
        eval_flops * plan.eval.n_examples,
        weights * eval_batches * (1 + e.eval_max_tokens),
        g,
        utilisation,
    )
    eval_item_s = eval_total_s / plan.eval.n_examples
    timings = StepTimings(
        sample_s=sample_s,
        train_s=train_s / upb,
        eval_s_per_item=eval_item_s,
        gpus=1.0,
        pilot_reused=True,
    )
    fc = project_feasibility(timings, plan)
    arms = len(plan.arms)
    total = arms * (
        plan.rollout_steps * (sample_flops + train_flops) + plan.eval.n_examples * eval_flops
    )
    return CostProjection(
        model=model,
        gpu=g,
        utilisation=utilisation,
        prompt=prompt,
        flops={
            "sampling_per_step": sample_flops,
            "training_per_step": train_flops,
            "eval_per_item": eval_flops,
            "total": total,
        },
        seconds_per={
            "sample_s": sample_s,
            "train_per_rollout_step_s": train_s,
            "eval_s_per_item": eval_item_s,
        },
        wall_seconds=fc.wall_seconds,
        gpu_hours=fc.gpu_hours,
        budget_gpu_hours=plan.budget.gpu_hours,
        budget_wall_minutes=plan.budget.max_wall_minutes,
        status=fc.status,
        problems=list(fc.problems),
        assumptions=[
            f"completions run to max_tokens = {lc} (eval: {e.eval_max_tokens})",
            f"{upb} updates per batch, {arms} arms one after the other",
            f"{rows_per_decode_batch} sequences per decode batch",
            "attention-score FLOPs, model loading and preflights not counted",
            f"utilisation {utilisation:.0%} is assumed; the pilot measures it",
        ],
    )


def measure_prompt_lengths(
    task: Any, tokenizer: Any | None, *, items: int = 256, tokenizer_name: str = ""
) -> PromptLengths:
    """Mean prompt length of the first `items` training prompts of `task`, rendered with the
    ChatML template. With `tokenizer` (the model's own) the count is exact; without it the
    offline byte-level ChatML tokenizer renders the text and characters are divided by
    `DEFAULT_CHARS_PER_TOKEN`."""
    from losslab.backends.local.tiny import make_tiny_tokenizer
    from losslab.tasks.base import ChatRenderer

    problems = list(task.train[:items])
    if not problems:
        raise ValueError("the task has no training prompts to measure")
    if tokenizer is not None:
        renderer = ChatRenderer(tokenizer, model_name=tokenizer_name)
        lengths = [len(renderer.build_prompt(task.messages(p)).to_ints()) for p in problems]
        how = f"{tokenizer_name or 'the model'}'s tokenizer on {len(problems)} training prompts"
        return PromptLengths(sum(lengths) / len(lengths), len(problems), how)
    renderer = ChatRenderer(make_tiny_tokenizer(), model_name=tokenizer_name)
    chars = [len(renderer.prompt_text(task.messages(p))) for p in problems]
    how = (
        f"{len(problems)} training prompts, ChatML-rendered characters / "
        f"{DEFAULT_CHARS_PER_TOKEN:g} (the model's tokenizer is not on this machine)"
    )
    return PromptLengths(sum(chars) / len(chars) / DEFAULT_CHARS_PER_TOKEN, len(problems), how)


def unmeasured_prompt_bound(plan: Plan) -> PromptLengths:
    """Without task data: the longest prompt the plan allows, `max_seq_len - max_tokens`."""
    bound = plan.max_seq_len - plan.engine.max_tokens
    return PromptLengths(
        float(bound), 0, "not measured (no task data here): upper bound max_seq_len - max_tokens"
    )


def local_config_and_tokenizer(base_model: str) -> tuple[Any | None, Any | None]:
    """The model's config and tokenizer when they are on this machine (a directory or the
    Hugging Face cache, `local_files_only=True`); (None, None) otherwise. Never downloads."""
    from transformers import AutoConfig, AutoTokenizer

    name = base_model.partition("@")[0]
    revision = base_model.partition("@")[2] or None
    try:
        config = AutoConfig.from_pretrained(name, revision=revision, local_files_only=True)
    except Exception:  # absent locally (OSError), or an unknown model type
        return None, None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, local_files_only=True)
    except Exception:
        tokenizer = None
    return config, tokenizer


def task_for_cost(plan: Plan, data: Any | None) -> Any | None:
    """The plan's task for measuring prompts: from `data`, an offline generator, or the local
    datasets cache (offline); None when none of them has it."""
    import os

    from losslab.tasks import make_task

    config = dict(plan.engine.task_config)
    data = data or config.pop("data", None)
    config.pop("data", None)
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update({k: "1" for k in saved})  # measuring must never wait on the network
    try:
        return make_task(plan.task_name, seed=plan.arms[0].seed, data=data, **config)
    except Exception:  # no data here: the projection uses the plan's upper bound instead
        return None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def plan_cost(
    plan: Plan,
    *,
    data: Any | None = None,
    task: Any | None = None,
    base_model: str | None = None,
    gpu: str = DEFAULT_GPU,
    utilisation: float = DEFAULT_UTILISATION,
) -> CostProjection:
    """The plan's cost projection with what this machine has: the model's config and tokenizer
    if local (else `KNOWN_SIZES` and the character estimate), the task's prompts if its data is
    here (else the `max_seq_len - max_tokens` bound). `base_model` overrides the plan's (the
    model a local run executes, `engine.local_base_model`)."""
    base_model = base_model or plan.base_model
    config, tokenizer = local_config_and_tokenizer(base_model)
    size = model_size(base_model, config)
    task = task if task is not None else task_for_cost(plan, data)
    if task is None:
        prompt = unmeasured_prompt_bound(plan)
    else:
        prompt = measure_prompt_lengths(task, tokenizer, tokenizer_name=base_model)
    return project_cost(plan, size, prompt, gpu=gpu, utilisation=utilisation)


def cost_vs_pilot(cost: CostProjection, pilot_wall_seconds: float, pilot_gpu_hours: float) -> dict:
    """The analytic projection next to the pilot's measured one (`feasibility.json`): the ratio
    measured / projected says how far the assumed utilisation and token counts were off."""
    return {
        "projected_wall_minutes": cost.wall_seconds / 60,
        "pilot_wall_minutes": pilot_wall_seconds / 60,
        "pilot_over_projected_wall": (
            pilot_wall_seconds / cost.wall_seconds if cost.wall_seconds > 0 else None
        ),
        "projected_gpu_hours": cost.gpu_hours,
        "pilot_gpu_hours": pilot_gpu_hours,
        "note": f"projected: {cost.gpu.name} at {cost.utilisation:.0%} of peak (assumed); "
        "pilot: this machine's measured step times",
    }

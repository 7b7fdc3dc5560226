"""Cost projection from the plan alone: FLOPs, wall time and GPU-hours before anything runs.

Per rollout step, with P = groups_per_batch prompts, G = group_size samples, prompt length L_p
(mean, measured on the task's training prompts), completion length L_c = max_tokens (an upper
bound: every completion runs to its cap), N = parameters used per token (for a MoE model, the
active ones), U = updates_per_batch, and F(tokens) the forward FLOPs of those tokens on the
model's architecture (`Architecture.forward_flops`: 2N per token, plus the attention scores of
its full-attention layers and the state updates of its Gated-DeltaNet layers):

    sampling  F_s = F(P L_p prefilled once per group) + F(P G L_c decoded)
    training  tokens run T = P (L_p + G L_c)    the local backend's prefix trie (a group's
                                                prompt once; families that cannot share
                                                prefixes: T = P G (L_p + L_c))
              F_t = passes x 2N T + (passes + 1) x cores(T)
                   passes = 2 (fused: forward + activation-gradient backward, "4N"; frozen base
                   weights get no gradient) when a minibatch's T / U tokens fit one micro-batch
                   (the backend's `max_tokens_per_batch` on the device), else 3 (two-phase: a
                   no-grad forward for the loss first, "6N"); the attention and delta-rule cores
                   cost twice their forward in the backward
    eval      F_e = F(L_p + L_eval) per item    greedy, L_eval = eval_max_tokens (upper bound)

Each phase's time is a roofline: the larger of its FLOPs at `utilisation` x the GPU's dense
bf16 peak and its weight reads at `utilisation` x the GPU's memory bandwidth (decoding reads
every weight once per token step of a batch of `rows_per_decode_batch` sequences: the local
backend's `max_batch_rows` = 64). The times go through `stats.feasibility.project_feasibility`,
the same arithmetic the pilot's measured projection uses, so the two are comparable line by
line. The utilisation is an assumption, stated with every projection; the pilot's measured
step times replace it once a real run starts (`feasibility.json`).

CPU calibration (`CPU_CALIBRATION`): the fraction of this machine's fp32 matmul rate that the
local backend's sampling and training reach per architecture, measured by `make bench`
(`bench/results_vs_trl*.json`, the same FLOP model divided by the measured phase times); the
projection also states the CPU seconds per rollout step it implies.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from losslab.plan import Plan
from losslab.stats.feasibility import StepTimings, project_feasibility, training_units


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
class Architecture:
    """What a token costs besides its 2N weight FLOPs, by layer kind (forward pass).

    Full attention: `4 x width x context` per token and layer (q . k and p . v, 2 FLOPs per
    multiply-add, `context` keys). Gated-DeltaNet, per token, value head and layer: chunked
    form (training, prefill; chunk C) `4 C Dk + C (Dk + Dv) + 2 C Dv + 6 Dk Dv` (k k^T and q k^T
    in the chunk, the triangular solve for [U W], the intra-chunk read, and the three state
    products W S, q S, k^T v'); one token at a time (decoding) `6 Dk Dv` (k S, the rank-one
    update, q S)."""

    name: str
    full_attention_layers: int
    attention_width: int  # query heads x head dim
    family: str = ""  # transformers model type ("llama", "qwen3_5", ...)
    linear_attention_layers: int = 0
    linear_heads: int = 0  # value heads (one state each)
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    shares_prefix: bool = True  # the local backend runs a group's prompt once (its trie)
    chunk: int = 64

    def attention_flops(self, context_sum: float) -> float:
        """Attention-score FLOPs of tokens whose contexts add up to `context_sum` keys."""
        return self.full_attention_layers * 4 * self.attention_width * context_sum

    def linear_flops(self, tokens: float, decode: bool = False) -> float:
        """Delta-rule FLOPs of `tokens` tokens (chunked form, or one at a time)."""
        c, dk, dv = self.chunk, self.linear_key_dim, self.linear_value_dim
        per_head = 6 * dk * dv if decode else 4 * c * dk + c * (dk + dv) + 2 * c * dv + 6 * dk * dv
        return self.linear_attention_layers * self.linear_heads * per_head * tokens

    def cores(self, tokens: float, context_sum: float, decode: bool = False) -> float:
        """FLOPs outside the weight matmuls: attention scores and delta-rule state work."""
        return self.attention_flops(context_sum) + self.linear_flops(tokens, decode)


def architecture_from_config(config: Any) -> Architecture:
    """The `Architecture` of a transformers (text) config: its layer kinds and widths."""
    layer_types = list(getattr(config, "layer_types", None) or [])
    layers = int(config.num_hidden_layers)
    full = layer_types.count("full_attention") if layer_types else layers
    linear = layer_types.count("linear_attention")
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    sliding = getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    )
    kinds = f"{linear} Gated-DeltaNet + {full} full attention" if linear else "full attention"
    family = str(getattr(config, "model_type", "?")).removesuffix("_text")
    return Architecture(
        name=f"{family} ({kinds}, {layers} layers)",
        full_attention_layers=full,
        attention_width=heads * head_dim,
        family=family,
        linear_attention_layers=linear,
        linear_heads=int(getattr(config, "linear_num_value_heads", 0) or 0) if linear else 0,
        linear_key_dim=int(getattr(config, "linear_key_head_dim", 0) or 0) if linear else 0,
        linear_value_dim=int(getattr(config, "linear_value_head_dim", 0) or 0) if linear else 0,
        shares_prefix=not sliding and set(layer_types or ["full_attention"]) <= KINDS_SHARED,
    )


KINDS_SHARED = {"full_attention", "linear_attention"}
"""Layer kinds whose prefixes the local backend shares (`logprobs.can_share_prefix`)."""

DENSE_ONLY = Architecture("unknown (2N per token only)", 0, 0, shares_prefix=False)


@dataclass(frozen=True)
class ModelSize:
    """Parameters per token of a base model, its architecture and where the numbers come from."""

    name: str
    params: float
    source: str
    exact: bool
    architecture: Architecture = DENSE_ONLY


SMOLLM2_ARCHITECTURE = Architecture("llama (full attention, 30 layers)", 30, 9 * 64, "llama")
"""SmolLM2-135M's published config: 30 layers, 9 query heads of 64 (its config.json)."""

KNOWN_SIZES: dict[str, ModelSize] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": ModelSize(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        134_515_008,
        "counted on the dequantized GGUF (shared/specs/local_model_measurements.md)",
        True,
        SMOLLM2_ARCHITECTURE,
    ),
}
"""Sizes of plan base models without a config on this machine or in
`backends.local.models.PUBLIC_CONFIGS` (which `model_size` counts exactly)."""


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
    """The size and architecture of `base_model`: counted from `config` when given, else from
    its bundled public config (`backends.local.models.public_config`), else `KNOWN_SIZES`."""
    from losslab.backends.local.models import public_config

    source = "counted from its config"
    if config is None:
        config = public_config(base_model)
        source = "counted from its published config (bundled, backends/local/public_configs)"
    if config is not None:
        arch = architecture_from_config(config)
        return ModelSize(base_model, params_from_config(config), source, True, arch)
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
    training_path: str = ""
    cpu: dict[str, Any] | None = None  # `cpu_projection`: this machine's CPU, calibrated

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
            f"{t['sample_s']:.3g} s; training {f['training_per_step']:.3g} FLOP"
            f"{' (6N, two-phase)' if 'two-phase' in self.training_path else ' (4N, fused)'} = "
            f"{t['train_per_rollout_step_s']:.3g} s",
            f"  per eval item     {f['eval_per_item']:.3g} FLOP = {t['eval_s_per_item']:.3g} s",
            f"  total             {f['total']:.3g} FLOP",
            f"  projected  {self.wall_seconds / 60:.3g} wall minutes (budget {budget_m}), "
            f"{self.gpu_hours:.3g} GPU-hours (budget {budget_h}): {self.status.upper()}",
            *[f"  problem    {p}" for p in self.problems],
            "  assumes    " + "; ".join(self.assumptions),
            *(
                [
                    f"  on CPU     sampling {self.cpu['sample_s']:.3g} s + training "
                    f"{self.cpu['train_per_rollout_step_s']:.3g} s per rollout step "
                    f"({self.cpu['how']})"
                ]
                if self.cpu
                else []
            ),
        ]


def _roofline_s(flops: float, weight_bytes: float, gpu: GpuClass, utilisation: float) -> float:
    compute = flops / (gpu.bf16_tflops * 1e12 * utilisation)
    memory = weight_bytes / (gpu.hbm_tb_per_s * 1e12 * utilisation)
    return max(compute, memory)


def _prompt_context(lp: float) -> float:
    """Keys seen by the `lp` tokens of one prompt (causal: 1 + 2 + ... + lp)."""
    return lp * (lp + 1) / 2


def _completion_context(lp: float, lc: float) -> float:
    """Keys seen by `lc` tokens decoded after an `lp`-token prompt."""
    return lc * lp + lc * (lc + 1) / 2


def forward_flops(
    arch: Architecture, n: float, tokens: float, context_sum: float, decode: bool = False
) -> float:
    """Forward FLOPs of `tokens` tokens whose contexts add up to `context_sum` keys."""
    return 2 * n * tokens + arch.cores(tokens, context_sum, decode)


def training_flops(arch: Architecture, n: float, tokens: float, context_sum: float, passes: int):
    """`passes` frozen-weight matmul passes (2: fused, 3: two-phase) over `tokens` tokens; the
    attention and delta-rule cores cost their forward once per forward pass and twice in the
    backward."""
    return passes * 2 * n * tokens + (passes + 1) * arch.cores(tokens, context_sum)


def training_path(minibatch_tokens: float, max_tokens_per_batch: int) -> tuple[int, str]:
    """(matmul passes, name) of the local backend's custom-loss path for a minibatch of
    `minibatch_tokens` trie tokens: fused (one forward with grad + backward, "4N") when it
    fits one micro-batch, else two-phase (a no-grad forward for the loss first, "6N")."""
    if minibatch_tokens <= max_tokens_per_batch:
        return (
            2,
            f"fused (4N): {minibatch_tokens:.0f} tokens per minibatch <= {max_tokens_per_batch}",
        )
    return 3, (
        f"two-phase (6N): {minibatch_tokens:.0f} tokens per minibatch > the "
        f"{max_tokens_per_batch}-token micro-batch"
    )


@dataclass(frozen=True)
class StepWork:
    """FLOPs of one rollout step and one evaluation item (formulas: module docstring)."""

    sampling_flops: float
    training_flops: float
    eval_flops: float
    training_tokens: float
    training_passes: int
    training_path: str


def step_work(
    arch: Architecture,
    n: float,
    *,
    groups: int,
    group_size: int,
    prompt_tokens: float,
    completion_tokens: float,
    updates: int,
    eval_tokens: float,
    max_tokens_per_batch: int,
) -> StepWork:
    """The FLOPs a rollout step of `groups` x `group_size` sequences runs on `arch`."""
    lp, lc, rows = prompt_tokens, completion_tokens, groups * group_size
    sampling = forward_flops(arch, n, groups * lp, groups * _prompt_context(lp))
    sampling += forward_flops(arch, n, rows * lc, rows * _completion_context(lp, lc), True)
    if arch.shares_prefix:  # the trie: each group's prompt once
        tokens = groups * lp + rows * lc
        context = groups * _prompt_context(lp) + rows * _completion_context(lp, lc)
    else:
        tokens = rows * (lp + lc)
        context = rows * (_prompt_context(lp) + _completion_context(lp, lc))
    passes, path = training_path(tokens / updates, max_tokens_per_batch)
    le = eval_tokens
    evaluation = forward_flops(arch, n, lp, _prompt_context(lp))
    evaluation += forward_flops(arch, n, le, _completion_context(lp, le), True)
    return StepWork(
        sampling, training_flops(arch, n, tokens, context, passes), evaluation, tokens, passes, path
    )


def project_cost(
    plan: Plan,
    model: ModelSize,
    prompt: PromptLengths,
    *,
    gpu: str = DEFAULT_GPU,
    utilisation: float = DEFAULT_UTILISATION,
    rows_per_decode_batch: int = 64,
    bytes_per_param: float = 2.0,
    max_tokens_per_batch: int | None = None,
) -> CostProjection:
    """Project the plan's FLOPs, wall time and GPU-hours (formulas: module docstring).
    `max_tokens_per_batch`: the local backend's micro-batch on CUDA unless given."""
    from losslab.backends.local.logprobs import DEFAULT_MAX_TOKENS_PER_BATCH

    if gpu not in GPU_CLASSES:
        raise ValueError(f"gpu {gpu!r}: expected one of {sorted(GPU_CLASSES)}")
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation = {utilisation}; expected a fraction in (0, 1]")
    g = GPU_CLASSES[gpu]
    e = plan.engine
    n, lc, upb = model.params, e.max_tokens, plan.updates_per_batch
    rows = e.groups_per_batch * e.group_size
    work = step_work(
        model.architecture,
        n,
        groups=e.groups_per_batch,
        group_size=e.group_size,
        prompt_tokens=prompt.mean_tokens,
        completion_tokens=lc,
        updates=upb,
        eval_tokens=e.eval_max_tokens,
        max_tokens_per_batch=max_tokens_per_batch or DEFAULT_MAX_TOKENS_PER_BATCH["cuda"],
    )
    weights = n * bytes_per_param
    decode_batches = math.ceil(rows / rows_per_decode_batch)
    # weight reads: one prefill pass per decode batch plus one pass per decoded token step
    sample_s = _roofline_s(work.sampling_flops, weights * decode_batches * (1 + lc), g, utilisation)
    train_s = _roofline_s(work.training_flops, weights * work.training_passes * upb, g, utilisation)
    eval_batches = math.ceil(plan.eval.n_examples / rows_per_decode_batch)
    eval_total_s = _roofline_s(
        work.eval_flops * plan.eval.n_examples,
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
    units = len(training_units(plan))  # every arm at every seed
    total = units * plan.rollout_steps * (work.sampling_flops + work.training_flops)
    total += (units + 1) * plan.eval.n_examples * work.eval_flops  # + the base model's eval
    sharing = (
        f"each group's prompt trained once (prefix trie): {work.training_tokens:.0f} tokens"
        if model.architecture.shares_prefix
        else f"no prefix sharing for this architecture: {work.training_tokens:.0f} tokens"
    )
    return CostProjection(
        model=model,
        gpu=g,
        utilisation=utilisation,
        prompt=prompt,
        flops={
            "sampling_per_step": work.sampling_flops,
            "training_per_step": work.training_flops,
            "eval_per_item": work.eval_flops,
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
            f"{upb} updates per batch, {units} trained arms ({len(plan.arms)} arms x "
            f"{units // len(plan.arms)} seed(s)) one after the other, the base model evaluated once",
            f"architecture {model.architecture.name}; training path {work.training_path}",
            f"{sharing} per rollout step",
            f"{rows_per_decode_batch} sequences per decode batch",
            "model loading and preflights not counted",
            f"utilisation {utilisation:.0%} is assumed; the pilot measures it",
        ],
        training_path=work.training_path,
        cpu=cpu_projection(model, work),
    )


@dataclass(frozen=True)
class CpuCalibration:
    """Fractions of the fp32 matmul rate (2048^3 GEMM) that the local backend's sampling and
    training reached on this project's 2-core CPU VM for one architecture family, in one
    `make bench` run (`calibration_from_bench` on its JSON)."""

    sampling_fraction: float
    training_fraction: float
    matmul_gflops: float
    threads: int
    source: str


CPU_CALIBRATION: dict[str, CpuCalibration] = {
    "llama": CpuCalibration(
        0.347,
        0.561,
        145.2,
        2,
        "bench/results_vs_trl.json (run D, SmolLM2-135M, 2026-12-01)",
    ),
    "qwen3_5": CpuCalibration(
        0.481,
        0.551,
        184.4,
        2,
        "bench/results_vs_trl_qwen3_5.json (run P, random Qwen3.5 at SmolLM2's widths, 2026-12-06, 2 threads, 3 rounds, load 0.8-2.2)",
    ),
}
"""By architecture family; `tests/stats/test_cost.py` re-derives each entry from its JSON."""


def calibration_from_bench(result: dict[str, Any], arch: Architecture, n: float) -> CpuCalibration:
    """The `CpuCalibration` of one `bench/bench_vs_trl.py` result: the FLOPs of the measured
    step on `arch` (this module's model; the trie's measured token count for training)
    divided by the machine's matmul rate and the measured median phase times."""
    from losslab.backends.local.logprobs import DEFAULT_MAX_TOKENS_PER_BATCH

    st, ll = result["settings"], result["losslab"]
    steps = ll["steps"]
    groups, group_size = st["prompts"], st["group_size"]
    lp = sum(st["prompt_tokens"]) / len(st["prompt_tokens"])
    lc = statistics.median(s["completion_tokens"] for s in steps) / (groups * group_size)
    rows = groups * group_size
    sampling = forward_flops(arch, n, groups * lp, groups * _prompt_context(lp))
    sampling += forward_flops(arch, n, rows * lc, rows * _completion_context(lp, lc), True)
    tokens = statistics.median(s["train_tokens_run"] for s in steps)
    context = groups * _prompt_context(lp) + rows * _completion_context(lp, lc)
    passes, _ = training_path(tokens / st["updates_per_batch"], DEFAULT_MAX_TOKENS_PER_BATCH["cpu"])
    training = training_flops(arch, n, tokens, context, passes)
    rate = result["machine"]["matmul_gflops"] * 1e9
    return CpuCalibration(
        sampling_fraction=sampling / rate / ll["phase_median_s"]["sampling"],
        training_fraction=training / rate / ll["phase_median_s"]["training"],
        matmul_gflops=result["machine"]["matmul_gflops"],
        threads=st["threads"],
        source="",
    )


def cpu_projection(model: ModelSize, work: StepWork) -> dict[str, Any] | None:
    """Seconds per rollout step on the calibrated CPU (fp32, its thread count) for the
    model's architecture family; None when that family has no calibration."""
    cal = CPU_CALIBRATION.get(model.architecture.family)
    if cal is None:
        return None
    rate = cal.matmul_gflops * 1e9
    return {
        "sample_s": work.sampling_flops / (rate * cal.sampling_fraction),
        "train_per_rollout_step_s": work.training_flops / (rate * cal.training_fraction),
        "how": f"fp32, {cal.threads} threads at {cal.matmul_gflops:g} GFLOP/s x the "
        f"{model.architecture.family} fractions {cal.sampling_fraction:.2f} (sampling) / "
        f"{cal.training_fraction:.2f} (training) measured in {cal.source}",
    }


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
    from losslab.backends.local.models import offline
    from losslab.tasks import make_task

    config = dict(plan.engine.task_config)
    data = data or config.pop("data", None)
    config.pop("data", None)
    with offline():  # measuring must never wait on the network
        try:
            return make_task(plan.task_name, seed=plan.arms[0].seed, data=data, **config)
        except Exception:  # no data here: the projection uses the plan's upper bound instead
            return None


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

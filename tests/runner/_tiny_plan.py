"""A seconds-long real plan: the tiny random model, 2 arms x 2 rollout steps, 4 eval items.

It keeps the user's GSM8K plan's correctness preflight, restoration preflight, gate checks and
decision rule, and shrinks everything that costs time. The gate bounds are opened so that a tiny
random model passes them (`gate_min_mask` closes one to make the gate fail on purpose).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GSM8K_PLAN = REPO / "examples" / "gsm8k_dppo_vs_grpo.json"


def make_eos_biased_tiny_model(path: Path) -> Path:
    """The tiny random model, edited so it ends its answer often enough for rewards to vary.

    A random 32-wide model is nearly uniform over its 259 tokens, so almost no 4-token completion
    stops and every reward is the same (zero advantage, zero gradient: resume would be trivially
    "identical"). Embedding column 0 is set to 1 for every token (1.8 for `<|im_end|>`); the tied
    head then adds ~(1.8 - 1) * sqrt(32) to the end-of-turn logit, about 25% per token, so groups
    mix finished and unfinished answers and the weights move.
    """
    from safetensors.torch import load_file, save_file

    from losslab.backends.local.tiny import make_tiny_model_dir, make_tiny_tokenizer

    make_tiny_model_dir(path, arch="llama", seed=0)
    eos = make_tiny_tokenizer().convert_tokens_to_ids("<|im_end|>")
    tensors = load_file(str(path / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"].clone()
    embed[:, 0] = 1.0
    embed[eos, 0] = 1.8
    tensors["model.embed_tokens.weight"] = embed
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def write_tiny_plan(path: Path, model_dir: Path, *, gate_min_mask: float = 0.0) -> Path:
    plan: dict[str, Any] = copy.deepcopy(json.loads(GSM8K_PLAN.read_text()))
    plan["title"] = "tiny: DPPO vs GRPO on a random 2-layer model (runner test)"
    plan["lora_rank"] = 2
    plan["steps"] = 4  # optim steps: 2 rollout steps x 2 updates per batch
    plan["batch_size"] = 8  # groups_per_batch 2 x group_size 4
    plan["max_seq_len"] = 128
    plan["dataset"] = {"name": "arithmetic"}
    plan["eval"] = {"benchmark": "arithmetic test", "metric": "accuracy", "n_examples": 4}
    plan["engine"] = {
        "group_size": 4,
        "groups_per_batch": 2,
        "max_tokens": 4,
        "eval_max_tokens": 4,
        "pilot_steps": 1,
        "task": "arithmetic",
        "task_config": {"n_train": 16},
        "local_base_model": str(model_dir),
    }
    for arm in plan["arms"]:
        arm["lr"] = 1e-2
    for group in plan["restoration_preflight"]["groups"]:
        for arm in group["arms"]:
            arm["optimizer_config"]["learning_rate"] = 1e-2
    plan["optimizer"]["lr"] = 1e-2
    for check in plan["activation_gate"]["checks"]:
        if check["metric"] == "executed_base_model":
            check["one_of"] = [plan["base_model"], str(model_dir)]
        elif check["metric"] == "dppo_masked_token_fraction":
            check["min"], check["max"] = gate_min_mask, 1.0
        elif check["metric"] != "executed_updates_per_batch":
            check["min"] = 0.0
    plan["budget"] = {"gpu_hours": 1.0, "max_wall_minutes": 60}
    path.write_text(json.dumps(plan, indent=1))
    return path

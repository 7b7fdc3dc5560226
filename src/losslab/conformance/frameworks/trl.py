"""huggingface/trl 1.16.0's GRPO loss: `GRPOTrainer._compute_loss` executed, unchanged, from an
installed trl==1.16.0, on a minimal trainer object.

The loss is a method of a heavy trainer class (model, accelerator, vLLM client), so it cannot be
extracted with `ast` like the other frameworks' functions. Instead a subprocess in a Python
environment that has trl 1.16.0 installed (`--source huggingface/trl=PATH`: a virtual
environment's directory or its python executable) imports `trl.trainer.grpo_trainer` and calls
the real, unbound `GRPOTrainer._compute_loss(self, model, inputs)` with `self` a
`types.SimpleNamespace` holding exactly the attributes the method reads (loss_type, epsilon_low/
high, beta = 0, importance_sampling_level, max_completion_length, gradient accumulation 1, one
process, no vLLM, no entropy mask or bonus, no aux loss). Only `_get_per_token_logps_and_entropies`
(the model forward) is replaced: it returns the fixture's current log-probs as the per-token
log-probs, so every line from the log-ratio to the returned loss is TRL's own. Inputs: the
whole fixture row is the completion (`prompt_ids` of width 0), `completion_mask` = the loss
mask, `old_per_token_logps` = the sampler log-probs, `advantages` one per row,
`num_items_in_batch` = the batch's loss tokens (the cispo/dapo normaliser).

Pinning: no git mirror available here holds the v1.16.0 commit, so TRL revisions pin the
released FILE: the 40 hex digits after `@` are the first 40 of the sha256 of
trl/trainer/grpo_trainer.py in the trl 1.16.0 wheel (its RECORD entry), and the run refuses an
environment whose trl is another version or whose file hashes differ. Nothing of TRL is stored
in losslab; the atlas golden keeps the numbers only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from losslab.conformance import pinned_runner
from losslab.conformance.fixtures import Fixture
from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    ReferenceResult,
    Resolution,
    ResolvedReference,
    refuse_unknown_arguments,
)
from losslab.conformance.sandbox import INFERRED_BLOCKED_NOTE, blocked_from_gradients, run_isolated
from losslab.plan import Revision, RevisionError

REPO = "huggingface/trl"
VERSION = "1.16.0"
PATH = "trl/trainer/grpo_trainer.py"
FUNCTION = "GRPOTrainer._compute_loss"
# sha256 of trl/trainer/grpo_trainer.py in the trl-1.16.0 wheel (RECORD: HD3CJT-zZTJpwR385...)
FILE_SHA256 = "1c3dc2253fb3653269c11dfce4f946f74201a4cb63e0887a37e8e3bb4a3f5503"
PIN = FILE_SHA256[:40]
LOSS_TYPES: dict[str, str] = {  # TRL loss_type -> losslab loss family
    "grpo": "ppo_clip",
    "bnpo": "ppo_clip",
    "dr_grpo": "dr_grpo",
    "dapo": "dapo",
    "cispo": "cispo",
    "luspo": "gspo",
}
KEYS = (
    "loss_type",
    "epsilon",
    "epsilon_high",
    "importance_sampling_level",
    "max_completion_length",
)
# GRPOConfig defaults in trl 1.16.0 (trl/trainer/grpo_config.py)
RECORDED_DEFAULTS: dict[str, Any] = {
    "loss_type": "dapo",
    "epsilon": 0.2,
    "epsilon_high": None,  # None: epsilon (the GRPOTrainer's epsilon_high = args.epsilon_high or epsilon)
    "importance_sampling_level": "token",
    "max_completion_length": 512,
}
RUN_TIMEOUT_S = 300.0

EMPTY_ROW_REASON = (
    "batch scope: TRL's mean over sequences divides by every row of the batch (an all-masked "
    "row too); losslab's seq-mean counts rows with a loss token and has no row-count knob"
)
UNGUARDED_REASON = (
    "guard: TRL takes exp(l - l_old) bare (e^91 = inf in float32, so an A < 0 token past it "
    "gives an inf loss and nan gradients); losslab's PPO-family ratio clamps l - l_s at 20 "
    "before exp and has no knob to lift it"
)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    refuse_unknown_arguments(
        revision, KEYS, f"TRL {FUNCTION} takes GRPOConfig fields {list(KEYS)} (beta is 0)"
    )
    kw = dict(revision.kwargs)
    notes, params = [], {}
    for key in KEYS:
        if key in kw:
            params[key] = kw[key]
        else:
            params[key] = defaults.get(key)
            notes.append(f"{key} not given: {params[key]!r}, the GRPOConfig default ({origin})")
    loss_type = params["loss_type"]
    if loss_type not in LOSS_TYPES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_type = {loss_type!r}; the adapter runs "
            f"{sorted(LOSS_TYPES)}"
        )
    if params["importance_sampling_level"] not in ("token", "sequence"):
        raise RevisionError(
            f"revision {revision.text!r}: importance_sampling_level = "
            f"{params['importance_sampling_level']!r}; expected 'token' or 'sequence'"
        )
    for key in ("epsilon", "epsilon_high", "max_completion_length"):
        value = params[key]
        if key == "epsilon_high" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise RevisionError(
                f"revision {revision.text!r}: {key} = {value!r}; expected a positive number"
            )
    params["epsilon_low"] = params["epsilon"]
    if params["epsilon_high"] is None:
        params["epsilon_high"] = params["epsilon"]
        notes.append("epsilon_high None: epsilon, as GRPOTrainer.__init__ sets it")
    family = LOSS_TYPES[loss_type]
    if loss_type == "grpo" and params["importance_sampling_level"] == "sequence":
        family = "gspo"  # TRL's GSPO recipe
    return Resolution(params, family, tuple(notes))


def _empty_rows(fixture: Fixture | None) -> int:
    if fixture is None:
        return 0
    return sum(1 for s in fixture.sequences if not s.loss_mask.any())


def losslab_config(ref: Any, fixture: Fixture | None = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each TRL loss_type, or why there is none."""
    p = ref.params
    kind, level = p["loss_type"], p["importance_sampling_level"]
    rows = float(len(fixture.sequences)) if fixture is not None else 1.0
    low, high = 1.0 - p["epsilon_low"], 1.0 + p["epsilon_high"]
    ppo = {"clip_low_threshold": low, "clip_high_threshold": high, "zero_adv": "keep"}
    if kind == "cispo":
        if level != "token":
            return LosslabConfig(None, reason="TRL cispo at sequence level: no losslab loss")
        # TRL: w = min(r, epsilon_high), an ABSOLUTE cap (5.0 recommended), no lower bound
        params = {
            "epsilon_meaning": "absolute_cap",
            "epsilon_high": float(p["epsilon_high"]),
            "reduction": "token-mean",
        }
        return LosslabConfig("cispo_eps", params, {}, ("TRL epsilon_high is the cap itself",))
    if kind in ("luspo", "grpo") and level == "sequence":
        gspo = {
            "level": "sequence",
            "epsilon_low": float(p["epsilon_low"]),
            "epsilon_high": float(p["epsilon_high"]),
            "log_ratio_guard": "none",  # TRL takes exp of the mean log-ratio bare
            "zero_adv": "keep",
        }
        if kind == "luspo":
            # (per_token_loss * mask).sum(-1).mean(): sum of n_d * L_d over EVERY row
            params = {**gspo, "reduction": "seq-mean-token-sum-norm", "norm_constant": rows}
            return LosslabConfig("luspo", params, {}, ("TRL divides by every row: C = rows",))
        reason = EMPTY_ROW_REASON if _empty_rows(fixture) else ""
        params = {**gspo, "reduction": "seq-mean-token-mean"}
        return LosslabConfig("gspo", params, {}, reason=reason)
    if level != "token":
        return LosslabConfig(
            None, reason=f"TRL {kind} at sequence level: losslab's {kind} ratio is per token"
        )
    if kind == "dr_grpo":
        # sum / (B * max_completion_length): the per-token loss / C, then / every row
        params = {
            **ppo,
            "constant": "max_completion_length",
            "max_completion_length": float(p["max_completion_length"]),
            "reduction": "seq-mean-token-sum-norm",
            "norm_constant": rows,
        }
        return LosslabConfig(
            "dr_grpo", params, {}, ("TRL divides by B * max_completion_length",), UNGUARDED_REASON
        )
    if kind == "dapo":
        params = {**ppo, "reduction": "token-mean"}
        return LosslabConfig("dapo", params, {}, reason=UNGUARDED_REASON)
    reduction = "token-mean" if kind == "bnpo" else "seq-mean-token-mean"
    reason = UNGUARDED_REASON
    if kind == "grpo" and _empty_rows(fixture):
        reason = f"{EMPTY_ROW_REASON}; {UNGUARDED_REASON}"
    params = {**ppo, "surrogate": "clipped", "reduction": reduction}
    return LosslabConfig("ppo", params, {}, reason=reason)


def describe_aggregation(ref: ResolvedReference) -> str:
    kind = ref.params["loss_type"]
    return {
        "grpo": "TRL grpo: mean over every row of (sum_t L m / n_d)",
        "bnpo": "TRL bnpo: sum L m / loss tokens of the batch",
        "dr_grpo": "TRL dr_grpo: sum L m / (B * max_completion_length)",
        "dapo": "TRL dapo: sum L m / num_items_in_batch (the batch's loss tokens)",
        "cispo": "TRL cispo: sum L m / num_items_in_batch (the batch's loss tokens)",
        "luspo": "TRL luspo: mean over every row of sum_t L m",
    }[kind]


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """TRL's unbound `GRPOTrainer._compute_loss` on a minimal trainer (runs in the subprocess
    of `run_installed`, in an environment with trl installed)."""
    import collections
    import types

    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)

    class OneProcess:
        """accelerate's Accelerator on one process: gather/reduce are the identity."""

        num_processes = 1
        sync_gradients = True

        def gather(self, x: Any) -> Any:
            return x

        def gather_for_metrics(self, x: Any) -> Any:
            return x

        def reduce(self, x: Any, reduction: str = "sum") -> Any:
            return x

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        rows = [seqs[i] for i in idx]
        logps = rt.pad([r["current_logprobs"] for r in rows], width).requires_grad_(True)
        mask = rt.pad([r["loss_mask"] for r in rows], width)

        def fixture_logps(model: Any, input_ids: Any, attention_mask: Any, *a: Any, **k: Any):
            # the model forward, replaced: the fixture's current log-probs, no entropy, no aux
            return logps, torch.zeros_like(logps), None

        trainer = types.SimpleNamespace(
            loss_type=p["loss_type"],
            epsilon_low=p["epsilon_low"],
            epsilon_high=p["epsilon_high"],
            beta=0.0,
            importance_sampling_level=p["importance_sampling_level"],
            max_completion_length=p["max_completion_length"],
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=None,
            use_vllm=False,
            vllm_importance_sampling_correction=False,
            current_gradient_accumulation_steps=1,
            aux_loss_enabled=False,
            _entropy_bonus_enabled=False,
            model=types.SimpleNamespace(training=True),
            accelerator=OneProcess(),
            args=types.SimpleNamespace(
                delta=None, steps_per_generation=1, use_bias_correction_kl=False
            ),
            _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
            _get_per_token_logps_and_entropies=fixture_logps,
        )
        inputs = {
            "prompt_ids": torch.zeros(len(rows), 0, dtype=torch.long),
            "prompt_mask": torch.zeros(len(rows), 0, dtype=torch.long),
            "completion_ids": torch.zeros(len(rows), width, dtype=torch.long),
            "completion_mask": mask,
            "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float32),
            "old_per_token_logps": rt.pad([r["sampler_logprobs"] for r in rows], width),
            "num_items_in_batch": mask.sum(),
        }
        loss = fn(trainer, None, inputs)
        (grad,) = torch.autograd.grad(loss, logps, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(logps)
        native = {k: float(v[-1]) for k, v in trainer._metrics["train"].items() if v}
        return loss, grad, native

    return rt.padded_outputs(run, seqs)


# The subprocess: TRL's environment, sockets off, the real method handed to `call_reference`.
_DRIVER = """
import builtins, hashlib, json, socket, sys
sys.path.insert(0, sys.argv[1])
import pinned_runner as pr
for name in ("connect", "connect_ex", "sendto", "bind"):
    setattr(socket.socket, name, pr._no_network)
socket.create_connection = pr._no_network
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
payload = json.load(open(sys.argv[2], encoding="utf-8"))
import trl
import trl.trainer.grpo_trainer as grpo
with open(grpo.__file__, "rb") as fh:
    sha = hashlib.sha256(fh.read()).hexdigest()
if trl.__version__ != payload["version"] or sha != payload["file_sha256"]:
    sys.exit(f"trl {trl.__version__} at {grpo.__file__} (sha256 {sha}) is not trl "
             f"{payload['version']} with grpo_trainer.py sha256 {payload['file_sha256']}")
fn = grpo.GRPOTrainer
for part in payload["function"].split(".")[1:]:
    fn = getattr(fn, part)
adapter = {"__builtins__": builtins}
exec(pr.adapter_code(payload["call_source"]), adapter)
out = adapter[payload["call_name"]](fn, payload, {"trl_file": grpo.__file__}, pr.RUNTIME)
out["trl_file"] = grpo.__file__
out["file_sha256"] = sha
json.dump(out, open(sys.argv[3], "w", encoding="utf-8"))
"""


def python_of(source: Path) -> Path:
    """The interpreter of a `--source huggingface/trl=PATH`: PATH itself when it is an
    executable file, else PATH/bin/python (a virtual environment)."""
    if source.is_file() and os.access(source, os.X_OK):
        return source
    candidate = source / "bin" / "python"
    if candidate.exists():
        return candidate
    raise RevisionError(
        f"--source {REPO}={source}: expected a Python environment with trl=={VERSION} "
        "installed (a virtual environment directory or its python executable)"
    )


def run_installed(ref: ResolvedReference, source: Path, fixture: Fixture) -> ReferenceResult:
    """Execute TRL's `GRPOTrainer._compute_loss` from the environment `source` on `fixture`."""
    rev = ref.revision
    if rev.commit.lower() != PIN or rev.path != PATH or rev.function != FUNCTION:
        raise RevisionError(
            f"revision {rev.text!r}: the TRL adapter runs {PATH}::{FUNCTION} of trl {VERSION}, "
            f"pinned as @{PIN} (the first 40 hex digits of the file's sha256)"
        )
    python = python_of(Path(source))
    payload = {
        "version": VERSION,
        "file_sha256": FILE_SHA256,
        "function": FUNCTION,
        "call_source": FRAMEWORK.call_source,
        "call_name": call_reference.__name__,
        "params": ref.params,
        "sequences": fixture.to_json_dict()["sequences"],
    }
    result = run_isolated(
        lambda inp, out: [
            str(python),
            "-I",
            "-c",
            _DRIVER,
            str(Path(pinned_runner.__file__).parent),
            str(inp),
            str(out),
        ],
        payload,
        timeout_s=RUN_TIMEOUT_S,
        fail=lambda message: RevisionError(f"revision {rev.text!r}: {message}"),
        who="TRL",
        action=f"running TRL's {FUNCTION} with {python}",
        prefix="losslab-trl-",
        extra_env={"HF_HUB_OFFLINE": "1"},
    )
    grads = [np.asarray(g, dtype=np.float32) for g in result["grad_D"]]
    blocked = blocked_from_gradients(fixture, grads)
    where = f"trl {VERSION} installed at {result['trl_file']}"
    return ReferenceResult(
        loss=float(result["loss"]),
        per_sequence_loss=[float(x) for x in result["per_sequence_loss"]],
        grad_D=grads,
        blocked_D=blocked,
        source={
            "kind": "pinned_source",
            "repo": REPO,
            "obtained": f"{where} (run by {python})",
            "label": f"pinned source executed: {REPO} {VERSION} {PATH}::{FUNCTION} from {where}",
            "checkout": str(source),
            "commit": f"v{VERSION} (release file pin {PIN[:12]})",
            "file_sha256": result["file_sha256"],
            "framework": "trl",
            "extracted": {PATH: {"sha256": result["file_sha256"], "names": [FUNCTION]}},
            "stubbed": ["GRPOTrainer._get_per_token_logps_and_entropies (fixture log-probs)"],
            "effective_params": ref.params,
            "notes": [*ref.notes, INFERRED_BLOCKED_NOTE],
            "native_metrics": result.get("native_metrics", {}),
        },
        dtype="float32",
        blocked_scope="nonzero_adv",
        resolved=ref,
    )


def _example(args: str) -> str:
    return f"{REPO}@{PIN}:{PATH}::{FUNCTION}({args})"


FRAMEWORK = Framework(
    name="trl",
    repo=REPO,
    functions=(FUNCTION,),
    families=("ppo_clip", "dr_grpo", "dapo", "cispo", "gspo"),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="TRL GRPOTrainer._compute_loss's per-loss_type normaliser",
    describe_aggregation=describe_aggregation,
    recorded_defaults=RECORDED_DEFAULTS,
    recorded_commit=PIN,
    installed=run_installed,
    fetchable=False,
    unfetchable_reason=(
        f"trl {VERSION} runs from an installed release: pass --source {REPO}=<a Python "
        f"environment with trl=={VERSION}>"
    ),
    example_revisions={
        "trl_grpo": _example("loss_type='grpo'"),
        "trl_bnpo": _example("loss_type='bnpo'"),
        "trl_dr_grpo": _example("loss_type='dr_grpo'"),
        "trl_dapo": _example("loss_type='dapo', epsilon_high=0.28"),
        "trl_cispo": _example("loss_type='cispo', epsilon_high=5.0"),
        "trl_gspo": _example(
            "loss_type='grpo', importance_sampling_level='sequence', epsilon=0.0003, "
            "epsilon_high=0.0004"
        ),
        "trl_luspo": _example(
            "loss_type='luspo', importance_sampling_level='sequence', epsilon=0.0003, "
            "epsilon_high=0.0004"
        ),
    },
)

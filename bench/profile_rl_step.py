"""Profile one losslab RL step (the runner's `engine.rl_step`) on SmolLM2-135M-Instruct.

    .venv/bin/python bench/profile_rl_step.py [--steps 2] [--out bench/profile_rl_step.json]

Settings of issue #14: fp32 on CPU, LoRA r=8 on every projection, chain_sum (the embedded
`arithmetic` task) rendered as `make bench` renders it (the template's default system turn: 53
tokens), 8 prompts x 8 samples x 32 new tokens, 2 updates per batch, 2 threads, GRPO clip loss. Step 0 is a warm-up; the last step runs under `torch.profiler` (CPU time and memory
per operator). The process's resident set size (RSS) is sampled every 20 ms by a thread, so the
record gives the peak RSS of each phase (snapshot, sampling, each forward_backward_custom,
optim_step), plus the sizes of what the step keeps alive (weights, LoRA, AdamW state).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from bench_models import ARCHS, bench_model_dir
from bench_vs_trl import rss_gib

from losslab.atomic import atomic_write_json
from losslab.backends.local import LocalServiceClient
from losslab.engine import ArmConfig, rl_step
from losslab.losses import as_tinker_loss_fn, parse_loss_spec
from losslab.tasks import batch_for_step, make_task
from losslab.tasks.base import ChatRenderer

GRPO_CLIP = "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"


class RssSampler:
    """Peak RSS per named phase, sampled by a background thread every `period_s`."""

    def __init__(self, period_s: float = 0.02) -> None:
        self._period = period_s
        self._phase = "setup"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_gib()
            self.peaks[self._phase] = max(self.peaks.get(self._phase, 0.0), rss)
            time.sleep(self._period)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = previous

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _wrap_phases(client, rss: RssSampler) -> None:
    """Tag the training client's calls with RSS phases (instance attributes shadow methods)."""
    counter = {"fb": 0}
    fb, opt, snap = (
        client.forward_backward_custom,
        client.optim_step,
        client.save_weights_and_get_sampling_client,
    )

    def forward_backward_custom(*a, **k):
        counter["fb"] += 1
        with rss.phase(f"forward_backward_custom_{(counter['fb'] - 1) % 2 + 1}"):
            return fb(*a, **k)

    def optim_step(*a, **k):
        with rss.phase("optim_step"):
            return opt(*a, **k)

    def save_weights_and_get_sampling_client(*a, **k):
        with rss.phase("snapshot"):
            sampler = snap(*a, **k).result()
        sample = sampler.sample

        def tagged_sample(*sa, **sk):
            future = sample(*sa, **sk)
            result = future.result

            def tagged_result(*ra, **rk):
                with rss.phase("sampling"):
                    return result(*ra, **rk)

            future.result = tagged_result
            return future

        sampler.sample = tagged_sample
        return sampler

    client.forward_backward_custom = forward_backward_custom
    client.optim_step = optim_step
    client.save_weights_and_get_sampling_client = save_weights_and_get_sampling_client


def label_linear_attention() -> None:
    """Wrap the Gated-DeltaNet functions of transformers' hybrid families in
    `record_function` labels, so the profile says how much of the step they take (the
    modeling code looks them up as module globals at each call)."""
    import importlib

    from losslab.backends.local import linear_attention

    for family in linear_attention.FAMILIES:
        linear_attention.install(family)  # label the dispatchers the layers really call
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        for name in linear_attention.FUNCTIONS:
            fn = getattr(module, name, None)
            if fn is None or getattr(fn, "_profile_label", None):
                continue

            def labelled(*a, _fn=fn, _name=name, **k):
                with torch.profiler.record_function(f"gdn::{_name}"):
                    return _fn(*a, **k)

            labelled._profile_label = name  # type: ignore[attr-defined]
            setattr(module, name, labelled)


def _nbytes(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="steps incl. the warm-up (>= 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/profile_rl_step.json")
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("--arch", choices=ARCHS, default="llama", help="bench_models.py's model")
    ap.add_argument(
        "--no-share-prefix", action="store_true", help="one pass per sequence (the old path)"
    )
    args = ap.parse_args()
    rss = RssSampler()
    label_linear_attention()
    service = LocalServiceClient(
        device="cpu", num_threads=args.threads, share_prefix=not args.no_share_prefix
    )
    model = str(bench_model_dir(args.arch))
    client = service.create_lora_training_client(model, rank=8, seed=0).result()
    task = make_task("arithmetic", seed=0)
    arm = ArmConfig(
        name="grpo",
        loss_fn=as_tinker_loss_fn(parse_loss_spec(GRPO_CLIP)),
        loss_name="ppo",
        learning_rate=1e-3,
        group_size=8,
        groups_per_batch=8,
        max_tokens=32,
        updates_per_batch=2,
    )
    _wrap_phases(client, rss)
    # the bench's prompts: the tokenizer's template with its default system turn (53 tokens)
    renderer = ChatRenderer(client.get_tokenizer(), model, template_system_turn=True)
    rows, table, labelled = [], "", {}
    for step in range(args.steps):
        problems = batch_for_step(task.train, step, arm.groups_per_batch)
        profiled = step == args.steps - 1 and not args.no_profiler
        if profiled:
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            ) as prof:
                row = rl_step(client, task, problems, arm, step, renderer=renderer)
            averages = prof.key_averages()
            table = averages.table(sort_by="self_cpu_time_total", row_limit=25)
            labels = [e for e in averages if e.key.startswith("gdn::")]
            labelled = {
                e.key: {"calls": e.count, "cpu_total_s": e.cpu_time_total / 1e6} for e in labels
            }
        else:
            row = rl_step(client, task, problems, arm, step, renderer=renderer)
        rows.append({k: v for k, v in row.items() if k.startswith(("time/", "tokens/"))})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    rss.stop()
    peft_model = client._model
    record = {
        "settings": f"{args.arch} bench model ({model}) fp32, LoRA r=8, 8x8x32, chain_sum, "
        f"2 updates, {args.threads} threads",
        "share_prefix": not args.no_share_prefix,
        "load_average": os.getloadavg(),
        "steps": rows,
        "peak_rss_gib_by_phase": rss.peaks,
        "ru_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "weights_gib": _nbytes(p for p in peft_model.parameters() if not p.requires_grad),
        "lora_gib": _nbytes(p for p in peft_model.parameters() if p.requires_grad),
        "adamw_state_gib": _nbytes(
            t
            for s in client._optimizer.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        ),
        "linear_attention_functions": labelled,
        "profiler_table": table.splitlines(),
    }
    atomic_write_json(args.out, record, indent=1)
    print(table)
    print(json.dumps(labelled, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "profiler_table"}, indent=1))


if __name__ == "__main__":
    main()

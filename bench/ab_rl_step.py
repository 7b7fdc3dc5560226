"""A/B of losslab's RL step between variants, each in its own process, rounds alternating.

    .venv/bin/python bench/ab_rl_step.py --arch qwen3_5 --threads 1 --rounds 2 \\
        --variant "new|" \\
        --variant "unshared|--no-share-prefix" \\
        --variant "reference kernels|LOSSLAB_LINEAR_ATTENTION=reference" \\
        --variant "old code|/tmp/old/bench/bench_vs_trl.py"

A variant is `label|item|item...`: an item ending in `.py` is the `bench_vs_trl.py` to run (its
own `src/` is imported: `git archive <commit> | tar -x -C /tmp/old` gives an older tree), an
item `NAME=VALUE` an environment variable, anything else an argument of its losslab worker.
Every process runs `bench_vs_trl.py`'s losslab worker (the bench's job: warm-up, then
`--steps` measured `rl_step`s); rounds alternate the order (A B C, C B A, ...). Reports the
median wall and CPU seconds per step and phase and the peak RSS per variant, and the ratio
of each variant's median CPU seconds to the first one's (CPU seconds are the steadier measure
on a shared machine). Timing unit tests are not used for speed; this is where A/B lives.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_variant(spec: str) -> dict:
    label, *items = spec.split("|")
    script, env, args = str(HERE / "bench_vs_trl.py"), {}, []
    for item in filter(None, (i.strip() for i in items)):
        if item.endswith(".py"):
            script = item
        elif "=" in item and not item.startswith("-"):
            name, value = item.split("=", 1)
            env[name] = value
        else:
            args.extend(item.split())
    return {"label": label, "script": script, "env": env, "args": args}


def run_variant(v: dict, args) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, v["script"], "--worker", "losslab", "--threads", str(args.threads)]
    cmd += ["--steps", str(args.steps), "--worker-out", out, "--model", args.model, *v["args"]]
    src = str(Path(v["script"]).resolve().parent.parent / "src")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    env.update(v["env"])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    print(f"[ab] {v['label']}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    result["load_average_after"] = os.getloadavg()
    return result


def summary(results: list[dict]) -> dict:
    steps = [s for r in results for s in r["steps"]]

    def med(key: str) -> float:
        return statistics.median(s[key] for s in steps)

    return {
        "steps": len(steps),
        "step_s": med("step_s"),
        "step_cpu_s": med("step_cpu_s"),
        "sampling_s": med("sampling_s"),
        "training_s": med("training_s"),
        "train_tokens_run": med("train_tokens_run"),
        "peak_rss_gib": max(r["ru_maxrss_gib"] for r in results),
        "per_process_step_cpu_s": [[s["step_cpu_s"] for s in r["steps"]] for r in results],
    }


def main() -> None:
    from bench_models import ARCHS, bench_model_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="label|item|...")
    ap.add_argument("--arch", choices=ARCHS, default="qwen3_5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the summary JSON here")
    args = ap.parse_args()
    args.model = "smollm2-135m" if args.arch == "llama" else str(bench_model_dir(args.arch))
    variants = [parse_variant(s) for s in args.variant]
    runs: dict[str, list[dict]] = {v["label"]: [] for v in variants}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            runs[v["label"]].append(run_variant(v, args))
    table = {label: summary(results) for label, results in runs.items()}
    base = table[variants[0]["label"]]["step_cpu_s"]
    for row in table.values():
        row["cpu_ratio_to_first"] = row["step_cpu_s"] / base
    record = {
        "arch": args.arch,
        "threads": args.threads,
        "rounds": args.rounds,
        "variants": [{k: v[k] for k in ("label", "script", "env", "args")} for v in variants],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": table,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1))
    print(
        "| variant | step wall (s) | step CPU (s) | sampling (s) | training (s) | trie tokens "
        "| peak RSS (GiB) | CPU / first |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for label, row in table.items():
        print(
            f"| {label} | {row['step_s']:.1f} | {row['step_cpu_s']:.1f} | "
            f"{row['sampling_s']:.1f} | {row['training_s']:.1f} | {row['train_tokens_run']:.0f} | "
            f"{row['peak_rss_gib']:.2f} | {row['cpu_ratio_to_first']:.3f} |"
        )


if __name__ == "__main__":
    main()

"""`make gpu-check`'s CPU dry mode: the same script (`bench/gpu_check.py --dry`) end to end on a
tiny shrink of Qwen3.5-2B's published config, a few tokens, in a subprocess (as `make` runs it).
The real-size run needs a GPU (docs/benchmarks.md); this keeps its code path tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_dry_run_reports_the_step(tmp_path):
    out = tmp_path / "results_gpu.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    job, step = r["job"], r["step"]
    assert r["dry"] and "DRY RUN" in r["what"] and r["device"] == "cpu (dry run)"
    # 2 prompts x 2 samples, no early stop: every completion runs to max_tokens = 4
    assert step["decoded_tokens"] == job["prompts"] * job["samples"] * job["max_tokens"]
    # the trie: each prompt once (6 tokens) + each datum's completion part (4 - 1 inputs)
    assert step["share_prefix"]
    assert step["training_trie_tokens"] == job["prompts"] * (6 + job["samples"] * 3)
    assert step["training_datum_tokens"] == job["prompts"] * job["samples"] * (6 + 3)
    assert not step["two_phase"]  # 2 x 18 tokens per minibatch fit the CPU micro-batch
    # the linear-attention layers ran through the prefix tree and the CPU decode paths
    ran = r["kernels_ran"]
    assert ran["chunk_gated_delta_rule"].get("prefix-tree/losslab-torch", 0) > 0
    assert ran["recurrent_gated_delta_rule"].get("losslab-torch", 0) > 0
    assert r["kernels_selected"]["chunk_gated_delta_rule"] == "losslab-torch"
    assert r["client"]["rank"] == job["rank"] and r["client"]["steps"] == job["updates"]
    # the projection counts the same job with stats.cost (no GPU class on a CPU)
    p = r["projection"]
    assert "fused (4N)" in p["training_path"] and p["training_flops"] > 0
    assert p["gpu_class"] is None and r["peak_gpu_memory_gib"] is None

"""`losslab compare A B` on losslab eval files and on real lm-evaluation-harness sample files.

The lm-eval files under data/lm_eval/ were written by lm-eval 0.4.13 itself (`--log_samples`) on
two tiny random models; data/lm_eval/README.md has the command. Expected numbers are derived from
the files' own per-item values (read here with plain json) and lm-eval's own aggregate.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.engine.evaluate import EvalItem, save_eval
from losslab.plan import load_plan
from losslab.stats.compare import ItemMismatch, command_line_rule, compare_files
from losslab.stats.decision import PairedOutcomes, decide

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
LM_EVAL = Path(__file__).resolve().parent / "data" / "lm_eval"


def _one(pattern: str) -> Path:
    (path,) = sorted(LM_EVAL.glob(pattern))
    return path


MC_A, MC_B = _one("model_a/samples_tiny_gsm8k_mc_*.jsonl"), _one("model_b/samples_tiny_gsm8k_mc_*")
GEN_A, GEN_B = _one("model_a/samples_tiny_gsm8k_gen_*"), _one("model_b/samples_tiny_gsm8k_gen_*")


def _eval_items(correct: list[bool]) -> list[EvalItem]:
    return [
        EvalItem(f"gsm8k-test-{i}", "18", "18" if c else "17", c, True, float(c), "...", 5)
        for i, c in enumerate(correct)
    ]


def _write_arm_files(tmp_path: Path, seed: int, n: int) -> tuple[Path, Path, dict, dict]:
    """eval files of the seed plan's two arms as `losslab run` writes them (save_eval, meta line)."""
    rng = np.random.default_rng(seed)
    treatment = [bool(x) for x in rng.random(n) < 0.75]
    baseline = [bool(x) for x in rng.random(n) < 0.70]
    rows_t, rows_b = _eval_items(treatment), _eval_items(baseline)
    a, b = tmp_path / "eval_dppo_seed0.jsonl", tmp_path / "eval_grpo_seed0.jsonl"
    save_eval(a, rows_t, meta={"arm": "dppo_seed0"})
    save_eval(b, rows_b, meta={"arm": "grpo_seed0"})
    read = {p: [json.loads(x) for x in p.read_text().splitlines()[1:]] for p in (a, b)}
    return a, b, read[a], read[b]


def test_compare_gives_the_runs_verdict_on_its_eval_files(tmp_path: Path) -> None:
    plan = load_plan(SEED_PLAN)
    a, b, rows_t, rows_b = _write_arm_files(tmp_path, seed=0, n=1319)
    # what the run's decision phase computes on these files (runner.components.decide, one seed)
    expected = decide(
        plan.decision_rule,
        PairedOutcomes.from_records({"dppo_seed0": rows_t, "grpo_seed0": rows_b}),
        plan=plan,
    ).to_dict()
    record = compare_files(a, b, plan.decision_rule, plan=plan)
    assert {k: record[k] for k in expected} == expected
    assert record["inputs"]["treatment"]["format"] == "losslab"


def test_cli_compare_on_refuted_eval_files_matches_decide(tmp_path: Path) -> None:
    # the demo's situation (treatment far worse): refuted, with the same interval as decide()
    plan = load_plan(SEED_PLAN)
    n = 64
    t = [i < 6 for i in range(n)]  # 6/64 right
    b = [i < 38 for i in range(n)]  # 38/64 right
    save_eval(tmp_path / "a.jsonl", _eval_items(t))
    save_eval(tmp_path / "b.jsonl", _eval_items(b))
    out = tmp_path / "verdict.json"
    args = [
        "compare",
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
        "--plan",
        str(SEED_PLAN),
    ]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    # estimate (6 - 38) / 64 = -0.5; CI -0.5 +- 2 sqrt(ln(40) / 128) = [-0.8395, -0.1605]
    half = 2 * math.sqrt(math.log(40) / (2 * n))
    assert (
        f"verdict: refuted  estimate -0.5000, 95% CI [{-0.5 - half:+.4f}, {-0.5 + half:+.4f}]"
        in (result.output)
    )
    record = json.loads(out.read_text())
    expected = decide(
        plan.decision_rule,
        {
            "dppo_seed0": {"accuracy": np.array(t, float)},
            "grpo_seed0": {"accuracy": np.array(b, float)},
        },
        plan=plan,
    ).to_dict()
    assert record["verdict"] == "refuted" and record["ci"] == pytest.approx(expected["ci"])
    # the power line at the measured discordance (32 discordant items of 64)
    assert record["power"]["discordance"] == 32 / 64
    assert "(measured)" in result.output


def _per_item(path: Path, metric: str, filter_: str) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["doc_id"]: float(r[metric]) for r in rows if r["filter"] == filter_}


def _lm_eval_aggregate(model: str, task: str, key: str) -> float:
    (results,) = sorted((LM_EVAL / model).glob("results_*.json"))
    return json.loads(results.read_text())["results"][task][key]


def test_verdict_on_two_real_lm_eval_sample_files() -> None:
    acc_a, acc_b = _per_item(MC_A, "acc", "none"), _per_item(MC_B, "acc", "none")
    n = len(acc_a)
    assert n == 20  # --limit 20
    rule = command_line_rule()
    record = compare_files(MC_B, MC_A, rule)  # A = model_b (treatment), B = model_a
    # the files' means are lm-eval's own aggregate acc
    assert record["arm_means"]["treatment"] == pytest.approx(
        _lm_eval_aggregate("model_b", "tiny_gsm8k_mc", "acc,none")
    )
    assert record["arm_means"]["baseline"] == pytest.approx(
        _lm_eval_aggregate("model_a", "tiny_gsm8k_mc", "acc,none")
    )
    wins = sum(acc_b[i] == 1 and acc_a[i] == 0 for i in acc_a)
    losses = sum(acc_b[i] == 0 and acc_a[i] == 1 for i in acc_a)
    half = 2 * math.sqrt(math.log(2 / 0.05) / (2 * n))  # Hoeffding, D in [-1, 1]
    estimate = (wins - losses) / n
    assert record["estimate"] == pytest.approx(estimate)
    assert record["ci"] == pytest.approx([estimate - half, estimate + half])
    assert record["verdict"] == "inconclusive"  # |estimate| <= 0.35 < half = 0.607
    mcnemar = record["secondary"]["mcnemar_exact"]
    assert (mcnemar["b"], mcnemar["c"]) == (wins, losses)
    assert record["to_settle"]["n_items"] > n
    assert record["inputs"]["treatment"] == {
        "path": str(MC_B),
        "format": "lm-eval",
        "field": "acc",
        "filter": "none",
        "items": 20,
        "mean": pytest.approx(sum(acc_b.values()) / n),
    }


def test_lm_eval_generate_task_needs_a_filter_and_reads_exact_match() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(GEN_B), str(GEN_A)])
    assert result.exit_code == 2
    assert "holds filters ['strict-match', 'flexible-extract']; name one with --filter" in (
        result.output
    )
    result = runner.invoke(app, ["compare", str(GEN_B), str(GEN_A), "--filter", "strict-match"])
    assert result.exit_code == 0, result.output
    # the random models never write "#### N": exact_match 0 on every item of both files
    assert set(_per_item(GEN_A, "exact_match", "strict-match").values()) == {0.0}
    assert "verdict: inconclusive  estimate +0.0000" in result.output
    assert "no number of items settles" in result.output


def test_mismatched_item_sets_are_refused_naming_the_first(tmp_path: Path) -> None:
    lines = MC_A.read_text().splitlines()
    short = tmp_path / "samples_short.jsonl"
    short.write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # doc_id 3 dropped
    missing_doc = json.loads(lines[3])["doc_id"]
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(MC_B), str(short)])
    assert result.exit_code == 2
    assert f"has 1 item that B ({short}) lacks, the first is '{missing_doc}'" in result.output
    with pytest.raises(ItemMismatch, match="A .* has 1 item that B"):
        compare_files(MC_B, short, command_line_rule())
    # an extra item on the other side is named too
    result = runner.invoke(app, ["compare", str(short), str(MC_B)])
    assert result.exit_code == 2 and f"B ({MC_B}) has 1 item that A" in result.output


def test_a_losslab_file_against_an_lm_eval_file_is_a_mismatch(tmp_path: Path) -> None:
    save_eval(tmp_path / "eval.jsonl", _eval_items([True] * 20))
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "eval.jsonl"), str(MC_A)])
    assert result.exit_code == 2 and "the first is 'gsm8k-test-0'" in result.output


def test_bad_compare_input_is_named(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(
        app, ["compare", str(MC_A), str(MC_B), "--plan", str(SEED_PLAN), "--alpha", "0.1"]
    )
    assert both.exit_code == 2 and "pass either --plan or a rule (--alpha)" in both.output
    alpha = runner.invoke(app, ["compare", str(MC_A), str(MC_B), "--alpha", "2"])
    assert alpha.exit_code == 2 and "--alpha 2.0: expected a value in (0, 1)" in alpha.output
    metric = runner.invoke(app, ["compare", str(MC_A), str(MC_B), "--lm-eval-metric", "f1"])
    assert metric.exit_code == 2 and "--lm-eval-metric 'f1' is not in the file" in metric.output
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"x": 1}\n')
    result = runner.invoke(app, ["compare", str(junk), str(MC_B)])
    assert result.exit_code == 2 and "not a losslab eval file" in result.output
    shutil.copy(MC_A, tmp_path / "dup.jsonl")
    with (tmp_path / "dup.jsonl").open("a") as f:
        f.write(MC_A.read_text().splitlines()[0] + "\n")
    result = runner.invoke(app, ["compare", str(tmp_path / "dup.jsonl"), str(MC_B)])
    assert result.exit_code == 2 and "item '0' appears twice" in result.output
    assert "Traceback" not in result.output

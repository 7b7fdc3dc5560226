"""Greedy evaluation on a task's test split: per-item results for the paired decision rule."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tinker

from losslab.atomic import atomic_write_text
from losslab.checks import PhaseResult
from losslab.engine.rl import resolve
from losslab.tasks.base import ChatRenderer, Problem, Task

__all__ = [
    "EVAL_PROBE_ITEMS",
    "EvalItem",
    "accuracy",
    "evaluate",
    "evaluate_weights",
    "evaluation_result",
    "load_eval",
    "rows_accuracy",
    "save_eval",
]

EVAL_PROBE_ITEMS = 32
"""Greedy answers timed after the pilot for the feasibility projection. A batching backend's cost
per item falls with the batch, so a probe of 4 overstated a 64-item evaluation about 4x on CPU;
32 (one rollout batch's worth) lands within ~1.5x at the cost of one short generation."""


@dataclass(frozen=True)
class EvalItem:
    """One graded test item (`correct` is what the paired decision rule pairs on `id`).

    `answer` is the reference answer, `prediction` the answer extracted from `completion`;
    `question` is the text shown to the model (empty in files written before it was recorded).
    """

    id: str
    answer: str
    prediction: str | None
    correct: bool
    format: bool
    reward: float
    completion: str
    completion_tokens: int
    question: str = ""


def evaluate(
    sampling_client: Any,
    task: Task,
    problems: Sequence[Problem],
    renderer: ChatRenderer,
    *,
    max_tokens: int,
    batch: int = 64,
    seed: int = 0,
) -> list[EvalItem]:
    """Greedy (temperature 0) completions of every problem, graded by the task, in input order.

    `batch` prompts are submitted before any result is read, so a batching backend decodes them
    together; on the Tinker service it bounds the requests in flight.
    """
    if batch < 1 or max_tokens < 1:
        raise ValueError(
            f"batch and max_tokens must be >= 1, got batch={batch}, max_tokens={max_tokens}"
        )
    params = tinker.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, seed=seed, stop=list(renderer.stop_token_ids)
    )
    items: list[EvalItem] = []
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        futures = [
            sampling_client.sample(
                prompt=renderer.build_prompt(task.messages(p)),
                num_samples=1,
                sampling_params=params,
            )
            for p in chunk
        ]
        for problem, future in zip(chunk, futures, strict=True):
            seq = resolve(future).sequences[0]
            text, stopped = renderer.parse(seq.tokens)
            grade = task.grade(problem, text, stopped)
            items.append(
                EvalItem(
                    id=problem.id,
                    answer=problem.answer,
                    prediction=grade.prediction,
                    correct=grade.correct,
                    format=grade.format,
                    reward=grade.reward,
                    completion=text,
                    completion_tokens=len(seq.tokens),
                    question=problem.question,
                )
            )
    return items


def evaluate_weights(
    training_client: Any, task: Task, renderer: ChatRenderer, n_items: int, max_tokens: int
) -> list[EvalItem]:
    """`evaluate` of a training client's current weights on the first `n_items` test items."""
    sampler = training_client.save_weights_and_get_sampling_client().result()
    return evaluate(sampler, task, task.test[:n_items], renderer, max_tokens=max_tokens)


def accuracy(items: Sequence[EvalItem]) -> float:
    """Share of items graded correct (exact match)."""
    if not items:
        raise ValueError("accuracy of an empty evaluation is undefined")
    return sum(item.correct for item in items) / len(items)


def rows_accuracy(rows: Sequence[Mapping[str, Any]]) -> float:
    """Share of evaluation rows (eval_<arm>.jsonl records) whose `correct` is true; 0 for none."""
    return sum(bool(r.get("correct")) for r in rows) / max(len(rows), 1)


def evaluation_result(rows: Sequence[Mapping[str, Any]]) -> PhaseResult:
    """One evaluation as a phase result: its per-item rows (the eval_<arm>.jsonl artifact), no
    checks (the decision rule judges them), and `"<n> items, accuracy <a>"` as its summary."""
    return PhaseResult(list(rows), summary=f"{len(rows)} items, accuracy {rows_accuracy(rows):.4f}")


def save_eval(
    path: str | Path, items: Sequence[EvalItem], meta: dict[str, Any] | None = None
) -> None:
    """Write per-item results as JSONL atomically (`eval_<arm>.jsonl`), optional meta first line."""
    records: list[dict[str, Any]] = [asdict(item) for item in items]
    if meta is not None:
        records.insert(0, {"meta": {**meta, "written_at": time.time()}})
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def load_eval(path: str | Path) -> list[EvalItem]:
    """Read the items written by `save_eval` (the meta line is skipped)."""
    items = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else None
        if record and "meta" not in record:
            items.append(EvalItem(**record))
    return items

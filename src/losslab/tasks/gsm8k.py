"""GSM8K as tinker-cookbook's math_rl env poses it (`recipes/math_rl/math_env.py`, `Gsm8kDataset`).

Prompt: the one-shot "strawberry" exchange, then `question + " Write your answer in \\boxed{} format."`.
Reward: `correct + 0.1 * (format - 1)`, where format = stopped on the end-of-turn token and wrote a
`\\boxed{}`, correct = the cookbook's sympy `grade_answer` of the last box against the text after
`####`, with its 1 s limit (`losslab.tasks.grading`).
Train order: shuffled by the plan's seed (the permutation `datasets.Dataset.shuffle(seed)` uses);
test order: file order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from losslab.tasks.base import Grade, Problem
from losslab.tasks.grading import extract_boxed, extract_gsm8k_answer, grade_answer_with_timeout

__all__ = ["GSM8K_FEWSHOT", "GSM8K_HUB_PATH", "GSM8K_SUFFIX", "Gsm8kTask", "load_gsm8k_rows"]

GSM8K_HUB_PATH = "openai/gsm8k"
"""The hub dataset (config `main`); the task's registry line declares the same path for the plan
layer, pinned by tests/tasks/test_tasks.py."""

GSM8K_SUFFIX = " Write your answer in \\boxed{} format."
GSM8K_FEWSHOT: list[dict[str, str]] = [
    {"role": "user", "content": "How many r's are in strawberry?" + GSM8K_SUFFIX},
    {
        "role": "assistant",
        "content": (
            "Let's spell the word out and number all the letters: 1) s 2) t 3) r 4) a 5) w "
            "6) b 7) e 8) r 9) r 10) y. We have r's at positions 3, 8, and 9. \\boxed{3}"
        ),
    },
]


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) of each data row: `file:line` for JSON lines, `file row N` for parquet."""
    if path.suffix == ".jsonl":
        rows = []
        try:
            with path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rows.append((f"{path}:{lineno}", json.loads(line)))
                    except (json.JSONDecodeError, RecursionError) as e:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises its own types for a damaged file
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        return [(f"{path} row {i + 1}", row) for i, row in enumerate(table)]
    raise ValueError(f"GSM8K data file {path} must end in .jsonl or .parquet")


def _row_problem(row: Any) -> str | None:
    """Why a GSM8K row is unusable, or None: an object with a non-empty string 'question' and a
    string 'answer' holding a `#### <number>` line."""
    if not isinstance(row, dict):
        return f"expected an object with 'question' and 'answer', got {type(row).__name__}"
    for key in ("question", "answer"):
        if key not in row:
            return f"no '{key}' field (fields: {', '.join(map(str, row)) or 'none'})"
        if not isinstance(row[key], str) or not row[key].strip():
            return f"'{key}' must be a non-empty string, got {row[key]!r:.60}"
    try:
        extract_gsm8k_answer(row["answer"])
    except ValueError as e:
        return str(e)
    return None


def _find_split_file(data: Path, split: str) -> Path:
    for pattern in (
        f"{split}.jsonl",
        f"{split}.parquet",
        f"{split}-*.parquet",
        f"main/{split}-*.parquet",
    ):
        found = sorted(data.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"--data {data}: no {split}.jsonl or {split}.parquet in that folder "
        "(expected GSM8K files with 'question' and 'answer' fields)"
    )


MAX_LISTED_ROW_PROBLEMS = 10


def _raise_row_problems(split: str, located: list[tuple[str, Any]]) -> None:
    """One ValueError listing the first bad rows, each as `file:line: why`."""
    problems = [(w, p) for w, r in located if (p := _row_problem(r)) is not None]
    if not problems:
        return
    lines = [f"  {where}: {why}" for where, why in problems[:MAX_LISTED_ROW_PROBLEMS]]
    more = len(problems) - len(lines)
    tail = [f"  ... and {more} more"] if more > 0 else []
    raise ValueError("\n".join([f"GSM8K {split} data: {len(problems)} bad rows", *lines, *tail]))


def load_gsm8k_rows(split: str, data: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of one GSM8K split: from `data` (a folder with {train,test}.jsonl|.parquet, or one
    file used for the requested split) or else from the hub / local cache through `datasets`."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if data is not None:
        path = Path(data)
        if path.is_dir():
            path = _find_split_file(path, split)
        elif not path.is_file():
            raise FileNotFoundError(f"--data {path}: no such file or folder")
        located = _read_rows(path)
        _raise_row_problems(split, located)
        rows = [row for _, row in located]
    else:
        import datasets

        try:
            rows = list(datasets.load_dataset(GSM8K_HUB_PATH, "main", split=split))
        except Exception as e:  # offline without a cache: say what to do instead
            raise RuntimeError(
                f"could not load {GSM8K_HUB_PATH} ({type(e).__name__}: {e}); pass --data with a "
                "folder holding train.jsonl and test.jsonl"
            ) from e
        _raise_row_problems(
            split, [(f"{GSM8K_HUB_PATH} {split} row {i + 1}", r) for i, r in enumerate(rows)]
        )
    if not rows:
        raise ValueError(f"GSM8K {split} split has no rows ({data or GSM8K_HUB_PATH})")
    return rows


def _problems(rows: list[dict[str, Any]], split: str) -> list[Problem]:
    return [
        Problem(
            id=f"gsm8k-{split}-{i}",
            question=row["question"],
            answer=extract_gsm8k_answer(row["answer"]),
        )
        for i, row in enumerate(rows)
    ]


@dataclass
class Gsm8kTask:
    """GSM8K with the cookbook's prompt, reward and data order.

    Args:
        seed: shuffles the training order (`np.random.default_rng(seed).permutation`, which is
            what `datasets.Dataset.shuffle(seed=seed)` applies); the test split keeps file order.
        data: local folder or file instead of the hub (`--data`).
        format_coef: weight of the format penalty; 0.1 as in the cookbook.
        grade_timeout_s: limit for grading one answer (the cookbook's `MathEnv.timeout`, 1 s); an
            answer whose grading overruns counts as wrong. Raise it only on a very slow machine.
        n_train / n_test: keep only the first items (after shuffling); None keeps all.
    """

    seed: int = 0
    data: str | Path | None = None
    format_coef: float = 0.1
    grade_timeout_s: float = 1.0
    n_train: int | None = None
    n_test: int | None = None
    name: str = "gsm8k"
    train: list[Problem] = field(init=False)
    test: list[Problem] = field(init=False)

    def __post_init__(self) -> None:
        train = _problems(load_gsm8k_rows("train", self.data), "train")
        order = np.random.default_rng(self.seed).permutation(len(train))
        self.train = [train[i] for i in order][: self.n_train]
        self.test = _problems(load_gsm8k_rows("test", self.data), "test")[: self.n_test]

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return [*GSM8K_FEWSHOT, {"role": "user", "content": problem.question + GSM8K_SUFFIX}]

    def grade(self, problem: Problem, text: str, stopped: bool) -> Grade:
        boxed = extract_boxed(text)
        fmt = stopped and boxed is not None
        correct = boxed is not None and grade_answer_with_timeout(
            boxed, problem.answer, self.grade_timeout_s
        )
        reward = float(correct) + self.format_coef * (float(fmt) - 1.0)
        return Grade(reward=reward, correct=correct, format=fmt, prediction=boxed)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": str(self.data) if self.data is not None else f"hf:{GSM8K_HUB_PATH}/main",
            "seed": self.seed,
            "n_train": len(self.train),
            "n_test": len(self.test),
            "format_coef": self.format_coef,
            "grader": f"cookbook math_rl sympy grade_answer, {self.grade_timeout_s:g} s limit",
            "prompt": "cookbook math_rl: strawberry one-shot + question + suffix",
            "suffix": GSM8K_SUFFIX,
        }

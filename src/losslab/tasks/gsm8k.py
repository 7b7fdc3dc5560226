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

__all__ = ["GSM8K_FEWSHOT", "GSM8K_SUFFIX", "Gsm8kTask", "load_gsm8k_rows"]

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


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        return rows
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"GSM8K data file {path} must end in .jsonl or .parquet")


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
        rows = _read_rows(path)
    else:
        import datasets

        try:
            rows = list(datasets.load_dataset("openai/gsm8k", "main", split=split))
        except Exception as e:  # offline without a cache: say what to do instead
            raise RuntimeError(
                f"could not load openai/gsm8k ({type(e).__name__}: {e}); pass --data with a "
                "folder holding train.jsonl and test.jsonl"
            ) from e
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ValueError(
                f"GSM8K {split} row {i} needs 'question' and 'answer' fields: {row!r:.200}"
            )
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
            "source": str(self.data) if self.data is not None else "hf:openai/gsm8k/main",
            "seed": self.seed,
            "n_train": len(self.train),
            "n_test": len(self.test),
            "format_coef": self.format_coef,
            "grader": f"cookbook math_rl sympy grade_answer, {self.grade_timeout_s:g} s limit",
            "prompt": "cookbook math_rl: strawberry one-shot + question + suffix",
            "suffix": GSM8K_SUFFIX,
        }

"""A throwaway task for tests/runner/test_errands.py, written as docs/contributing.md's "Add a
task" errand says: one module with a class satisfying `losslab.tasks.base.Task`.

Parity of a number: answer 1 for odd, 0 for even; graded on the last number of the completion.
Test and training numbers are disjoint draws, so the overlap audit finds nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from losslab.tasks.base import Grade, Problem
from losslab.tasks.grading import extract_last_number, numeric_equal


@dataclass
class ParityTask:
    seed: int = 0
    n_train: int = 16
    n_test: int = 4
    format_coef: float = 0.1
    name: str = "parity"
    train: list[Problem] = field(init=False)
    test: list[Problem] = field(init=False)

    def __post_init__(self) -> None:
        numbers = random.Random(self.seed).sample(range(1000), self.n_test + self.n_train)
        self.test = self._problems(numbers[: self.n_test], "test")
        self.train = self._problems(numbers[self.n_test :], "train")

    @staticmethod
    def _problems(numbers: list[int], split: str) -> list[Problem]:
        return [
            Problem(
                id=f"parity-{split}-{i}",
                question=f"Is {k} odd? Answer 1 for odd, 0 for even.",
                answer=str(k % 2),
            )
            for i, k in enumerate(numbers)
        ]

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.question}]

    def grade(self, problem: Problem, text: str, stopped: bool) -> Grade:
        prediction = extract_last_number(text)
        correct = numeric_equal(prediction, problem.answer)
        fmt = stopped and prediction is not None
        reward = float(correct) + self.format_coef * (float(fmt) - 1.0)
        return Grade(reward=reward, correct=correct, format=fmt, prediction=prediction)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "n_train": len(self.train), "n_test": len(self.test)}

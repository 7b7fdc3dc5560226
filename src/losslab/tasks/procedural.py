"""Offline procedural tasks from reasoning-gym (any of its datasets, by name and config).

The embedded default (`arithmetic`) is `chain_sum` with two single-digit terms and no negation,
prompted as `"{question}\\nAnswer with just the number."` and graded on the last number in the
completion: the only setting on which SmolLM2-135M-Instruct gets mixed rewards within a group
(figures in docs/tasks.md).

Test items are generated first (seed `seed + 1`); training items come from a separate stream
(seed `seed`) with every question that also appears in the test split removed, so the
train/test overlap audit reports 0 by construction even where the item space is small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from losslab.tasks.base import Grade, Problem, normalize_question
from losslab.tasks.grading import extract_last_number, numeric_equal

__all__ = ["ARITHMETIC_CONFIG", "ARITHMETIC_SUFFIX", "ReasoningGymTask", "arithmetic_task"]

ARITHMETIC_SUFFIX = "\nAnswer with just the number."
ARITHMETIC_CONFIG: dict[str, Any] = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "allow_negation": False,
}


def _generate(dataset: str, size: int, seed: int, config: dict[str, Any]) -> list[dict[str, Any]]:
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)
    except (KeyError, ValueError, TypeError, AssertionError) as e:
        raise ValueError(
            f"reasoning-gym dataset {dataset!r} with config {config} could not be created: {e}"
        ) from e
    return [ds[i] for i in range(len(ds))]


@dataclass
class ReasoningGymTask:
    """A reasoning-gym dataset as an RL task with a numeric last-number grader.

    Args:
        dataset: reasoning-gym dataset name (e.g. `chain_sum`, `basic_arithmetic`, `gsm_symbolic`).
        config: keyword arguments of that dataset's config (`min_terms`, ...).
        seed: training stream seed; the test split uses `seed + 1`.
        n_train: training items to draw before removing test duplicates.
        n_test: distinct test items.
        suffix: appended to each question.
        format_coef: reward `correct + format_coef * (format - 1)`; format = stopped on the
            end-of-turn token and wrote a number.
        answer_mode: `numeric` (last number, exact numeric match) or `score` (reasoning-gym's own
            `score_answer` on the stripped completion, >= 1.0 counts as correct) for tasks whose
            answers are not numbers.
    """

    dataset: str = "chain_sum"
    config: dict[str, Any] = field(default_factory=lambda: dict(ARITHMETIC_CONFIG))
    seed: int = 0
    n_train: int = 2000
    n_test: int = 64
    suffix: str = ARITHMETIC_SUFFIX
    format_coef: float = 0.1
    answer_mode: str = "numeric"
    name: str = ""
    train: list[Problem] = field(init=False)
    test: list[Problem] = field(init=False)
    _entries: dict[str, dict[str, Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.answer_mode not in ("numeric", "score"):
            raise ValueError(f"answer_mode must be 'numeric' or 'score', got {self.answer_mode!r}")
        if self.n_test < 0 or self.n_train <= 0:
            raise ValueError(
                f"n_train must be > 0 and n_test >= 0, got {self.n_train}, {self.n_test}"
            )
        self.name = self.name or f"reasoning_gym:{self.dataset}"
        self._entries = {}
        # Distinct test questions: draw a few times more than needed, keep first occurrences.
        test, seen = [], set()
        if self.n_test:
            for entry in _generate(
                self.dataset, max(4 * self.n_test, 16), self.seed + 1, self.config
            ):
                key = normalize_question(entry["question"])
                if key not in seen:
                    seen.add(key)
                    test.append(entry)
                if len(test) == self.n_test:
                    break
        train = [
            e
            for e in _generate(self.dataset, self.n_train, self.seed, self.config)
            if normalize_question(e["question"]) not in seen
        ]
        if not train:
            raise ValueError(
                f"{self.dataset} with {self.config}: every training item is also a test item; "
                "lower n_test or widen the config"
            )
        self.test = self._problems(test, "test")
        self.train = self._problems(train, "train")

    def _problems(self, entries: list[dict[str, Any]], split: str) -> list[Problem]:
        out = []
        for i, entry in enumerate(entries):
            pid = f"{self.dataset}-{split}-{i}"
            self._entries[pid] = entry
            out.append(Problem(id=pid, question=entry["question"], answer=str(entry["answer"])))
        return out

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return [{"role": "user", "content": problem.question + self.suffix}]

    def grade(self, problem: Problem, text: str, stopped: bool) -> Grade:
        if self.answer_mode == "numeric":
            prediction = extract_last_number(text)
            correct = numeric_equal(prediction, problem.answer)
        else:
            import reasoning_gym

            prediction = text.strip()
            scorer = reasoning_gym.get_score_answer_fn(self.dataset)
            correct = float(scorer(prediction, self._entries[problem.id])) >= 1.0
        fmt = stopped and bool(prediction)
        reward = float(correct) + self.format_coef * (float(fmt) - 1.0)
        return Grade(reward=reward, correct=correct, format=fmt, prediction=prediction)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "config": dict(self.config),
            "seed": self.seed,
            "n_train": len(self.train),
            "n_test": len(self.test),
            "suffix": self.suffix,
            "format_coef": self.format_coef,
            "answer_mode": self.answer_mode,
        }


def arithmetic_task(seed: int = 0, n_test: int = 64, **overrides: Any) -> ReasoningGymTask:
    """The embedded default task: 2-term single-digit `chain_sum`, "Answer with just the number."."""
    return ReasoningGymTask(
        dataset="chain_sum",
        config=dict(ARITHMETIC_CONFIG),
        seed=seed,
        n_test=n_test,
        name="arithmetic",
        **overrides,
    )

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
import os
import stat
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


MAX_DATA_FILE_BYTES = 512 * 2**20
"""Largest data file read (GSM8K's train split is ~4 MB): a bound, so `/dev/zero` or a runaway
file is refused by its size instead of read until memory runs out."""
MAX_DATA_LINE_BYTES = 2**20
"""Longest JSON line read (a GSM8K row is ~1 KB): a longer one is refused naming file:line,
never handed to the tokenizer (a 50 MB line aborted it)."""


def check_data_file(path: Path) -> int:
    """The size of `path` if it is a regular file within `MAX_DATA_FILE_BYTES`, else ValueError
    naming it: only regular files are read (a device such as /dev/zero, a FIFO that would block,
    a socket are refused; a symlink counts as what it points to)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"--data {path}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise ValueError(f"{path}: is {kind}; only regular data files are read")
    if st.st_size > MAX_DATA_FILE_BYTES:
        raise ValueError(
            f"{path}: {st.st_size} bytes, more than the {MAX_DATA_FILE_BYTES} a data file may "
            "hold (losslab.tasks.gsm8k.MAX_DATA_FILE_BYTES)"
        )
    return st.st_size


def _bad_unicode(value: Any, where: str = "$") -> str | None:
    """The JSON path of the first string (key or value) that is not valid Unicode text (a lone
    surrogate such as "\\ud800", which JSON allows and UTF-8 cannot encode), else None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return at
        elif isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, f"{at} (a key)"))
                stack.append((v, f"{at}.{k}"))
        elif isinstance(node, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(node))
    return None


def _read_jsonl_rows(path: Path) -> list[tuple[str, Any]]:
    """(file:line, row) of each JSON line, each line bounded by `MAX_DATA_LINE_BYTES` and its
    strings checked to be valid Unicode."""
    rows = []
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(MAX_DATA_LINE_BYTES + 1)
            if not raw:
                return rows
            lineno += 1
            if len(raw) > MAX_DATA_LINE_BYTES:
                raise ValueError(
                    f"{path}:{lineno}: the line is longer than {MAX_DATA_LINE_BYTES} bytes "
                    "(losslab.tasks.gsm8k.MAX_DATA_LINE_BYTES); a data row is one problem"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            bad = _bad_unicode(row)
            if bad is not None:
                raise ValueError(
                    f"{path}:{lineno}: {bad} is not valid Unicode text (a lone surrogate escape "
                    "such as \\ud800); fix or remove the row"
                )
            rows.append((f"{path}:{lineno}", row))


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) of each data row: `file:line` for JSON lines, `file row N` for parquet."""
    check_data_file(path)
    if path.suffix == ".jsonl":
        return _read_jsonl_rows(path)
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
        elif not os.path.exists(path):
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

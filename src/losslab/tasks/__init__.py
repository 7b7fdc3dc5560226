"""losslab.tasks: GSM8K and reasoning-gym tasks, chat prompts, numeric graders, overlap audit."""

from losslab.tasks.base import (
    ChatRenderer,
    Grade,
    OverlapReport,
    Problem,
    Task,
    batch_for_step,
    normalize_question,
    overlap_audit,
)
from losslab.tasks.grading import (
    GraderDisagreement,
    extract_boxed,
    extract_gsm8k_answer,
    extract_last_number,
    grade_answer,
    grade_answer_with_timeout,
    grader_disagreements,
    math_verify_grade,
    normalize_numeric,
    numeric_equal,
)
from losslab.tasks.gsm8k import GSM8K_FEWSHOT, GSM8K_SUFFIX, Gsm8kTask, load_gsm8k_rows
from losslab.tasks.procedural import ARITHMETIC_CONFIG, ReasoningGymTask, arithmetic_task
from losslab.tasks.registry import make_task

__all__ = [
    "ARITHMETIC_CONFIG",
    "GSM8K_FEWSHOT",
    "GSM8K_SUFFIX",
    "ChatRenderer",
    "Grade",
    "GraderDisagreement",
    "Gsm8kTask",
    "OverlapReport",
    "Problem",
    "ReasoningGymTask",
    "Task",
    "arithmetic_task",
    "batch_for_step",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_last_number",
    "grade_answer",
    "grade_answer_with_timeout",
    "grader_disagreements",
    "math_verify_grade",
    "load_gsm8k_rows",
    "make_task",
    "normalize_numeric",
    "normalize_question",
    "numeric_equal",
    "overlap_audit",
]

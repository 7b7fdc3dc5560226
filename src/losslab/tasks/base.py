"""Task interface: problems, grades, chat prompts, batch order and the train/test overlap audit."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import tinker

__all__ = [
    "ChatRenderer",
    "Grade",
    "OverlapReport",
    "Problem",
    "Task",
    "batch_for_step",
    "normalize_question",
    "overlap_audit",
]


@dataclass(frozen=True)
class Problem:
    """One task item: a stable id, the question shown to the model and the ground-truth answer."""

    id: str
    question: str
    answer: str


@dataclass(frozen=True)
class Grade:
    """Reward of one completion: `reward = correct + format_coef * (format - 1)` (cookbook math env)."""

    reward: float
    correct: bool
    format: bool
    prediction: str | None


@runtime_checkable
class Task(Protocol):
    """What the engine needs from a task. `train` is already in training order."""

    name: str
    train: list[Problem]
    test: list[Problem]

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """Chat messages (few-shot prefix + user turn) for one problem."""
        ...

    def grade(self, problem: Problem, text: str, stopped: bool) -> Grade:
        """Grade the visible completion text; `stopped` is True when it ended on the end-of-turn token."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able description of the task (name, sizes, prompt settings) for the run record."""
        ...


def batch_for_step(problems: Sequence[Problem], step: int, batch_size: int) -> list[Problem]:
    """The training problems of global step `step`, with the cookbook's data cursor.

    The training order holds `ceil(N/B)` batches: batch i is rows `[i*B, min((i+1)*B, N))`, so the
    last batch of an epoch is short rather than wrapping into the next (cookbook
    `Gsm8kDataset.get_batch`); step s uses batch `s % ceil(N/B)`, each epoch replaying the same
    order (`EpochCycledRLDataset` without a shuffle seed). The cursor is the step index, so a
    resumed or paired arm sees the same problems.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if not problems:
        raise ValueError("the task has no training problems")
    n_batches = -(-len(problems) // batch_size)
    start = (step % n_batches) * batch_size
    return list(problems[start : start + batch_size])


# ----------------------------------------------------------------------------- chat formatting


_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class ChatRenderer:
    """Builds generation prompts with the tokenizer's own chat template and parses completions.

    Renders what the cookbook's renderers render: the given messages and nothing else. A ChatML
    template that writes a default system turn when the conversation has none (SmolLM2's "You
    are a helpful AI assistant named SmolLM...", 21 extra tokens on the GSM8K prompt) has that turn
    removed, so SmolLM2 prompts equal the cookbook's `qwen3_instruct` ChatML rendering token for
    token. Qwen3 / Qwen3.5 models get `enable_thinking=False`, the generation prompt of the
    cookbook's `qwen3_disable_thinking` / `qwen3_5_disable_thinking` renderers. Sampling stops
    on the end-of-turn token (`<|im_end|>` for ChatML models), which the sampler returns as the
    last token, as Tinker does.
    """

    tokenizer: Any
    model_name: str = ""
    stop_token_ids: list[int] = field(default_factory=list)
    # True: keep the system turn a template writes on its own (what `apply_chat_template` and
    # TRL's trainers render). Only to compare against such a stack token for token (the TRL
    # bench); leave False for experiments, whose prompts then match the cookbook's.
    template_system_turn: bool = False

    def __post_init__(self) -> None:
        if getattr(self.tokenizer, "chat_template", None) in (None, ""):
            raise ValueError(
                f"tokenizer of {self.model_name or 'the model'!r} has no chat_template; "
                "losslab formats prompts with the model's own chat template"
            )
        if not self.stop_token_ids:
            self.stop_token_ids = [self._end_of_turn_id()]
        self._default_system_turn = self._find_default_system_turn()

    def _find_default_system_turn(self) -> str:
        """The system turn a ChatML template writes on its own for a conversation without one
        ("" when it writes none)."""
        marker = "\x00losslab-probe\x00"
        probe = self._render([{"role": "user", "content": marker}], add_generation_prompt=False)
        head = probe[: probe.find(marker)]
        user_header = head.rfind("<|im_start|>user")
        if user_header > 0 and "<|im_start|>system" in head[:user_header]:
            return head[:user_header]
        return ""

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {}
        if "qwen3" in self.model_name.lower():
            kwargs["enable_thinking"] = False
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def _end_of_turn_id(self) -> int:
        vocab = self.tokenizer.get_vocab()
        for token in _END_OF_TURN_TOKENS:
            if token in vocab:
                return int(vocab[token])
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"cannot find an end-of-turn token for {self.model_name!r}")
        return int(self.tokenizer.eos_token_id)

    def prompt_text(self, messages: list[dict[str, str]]) -> str:
        text = self._render(messages, add_generation_prompt=True)
        injected = "" if self.template_system_turn else self._default_system_turn
        if injected and messages and messages[0].get("role") != "system":
            text = text.removeprefix(injected)
        return text

    def build_prompt(self, messages: list[dict[str, str]]) -> tinker.ModelInput:
        # The template already writes any BOS token, so the text is encoded without specials.
        tokens = self.tokenizer.encode(self.prompt_text(messages), add_special_tokens=False)
        return tinker.ModelInput.from_ints([int(t) for t in tokens])

    def parse(self, tokens: Sequence[int]) -> tuple[str, bool]:
        """Visible text of a completion and whether it ended on the end-of-turn token."""
        tokens = list(tokens)
        stopped = bool(tokens) and tokens[-1] in self.stop_token_ids
        if stopped:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=True), stopped


# ----------------------------------------------------------------------------- overlap audit


def normalize_question(text: str) -> str:
    """NFKC, lower case, punctuation to spaces, collapsed whitespace: how overlap is compared."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"[^\w]+", " ", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class OverlapReport:
    """Evaluation items whose normalised question also appears in the training data."""

    n_eval: int
    n_train: int
    n_overlap: int
    overlap_ids: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_eval": self.n_eval,
            "n_train": self.n_train,
            "n_overlap": self.n_overlap,
            "overlap_fraction": self.n_overlap / self.n_eval if self.n_eval else 0.0,
            "overlap_ids": self.overlap_ids,
        }


def overlap_audit(train: Sequence[Problem], test: Sequence[Problem]) -> OverlapReport:
    """Count test items whose normalised question is among the training questions."""
    seen = {normalize_question(p.question) for p in train}
    hits = [p.id for p in test if normalize_question(p.question) in seen]
    return OverlapReport(
        n_eval=len(test), n_train=len(train), n_overlap=len(hits), overlap_ids=hits
    )

"""Minimal Tinker-shaped fakes for engine tests: scripted completions, hand-set policy drift.

FakeSamplingClient answers group j of every request with `completions[j % len(completions)]`
(text + `<|im_end|>`), each token with sampler log-prob `SAMPLER_LP`. FakeTrainingClient returns,
in `forward_backward_custom`, current log-probs `sampler + mismatch + shift * k` on every
position, where k is the number of optim steps since the last sampler snapshot and `shift` is
`shifts[snapshot]`: so mismatch and drift at each minibatch update are known by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import tinker
import torch

from losslab.backends.local.tiny import make_tiny_tokenizer

SAMPLER_LP = -1.0


class Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


@dataclass
class FakeSamplingClient:
    tokenizer: Any
    completions: list[str]
    calls: list[dict[str, Any]]
    answers: dict[str, str] | None = None  # prompt text fragment -> completion (for eval)

    def sample(
        self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> Done:
        self.calls.append(
            {"prompt": prompt.to_ints(), "num_samples": num_samples, "params": sampling_params}
        )
        eot = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if self.answers is not None:
            prompt_text = self.tokenizer.decode(prompt.to_ints())
            texts = [next(a for q, a in self.answers.items() if q in prompt_text)] * num_samples
        else:
            texts = [self.completions[j % len(self.completions)] for j in range(num_samples)]
        seqs = []
        for text in texts:
            tokens = self.tokenizer.encode(text, add_special_tokens=False) + [eot]
            seqs.append(
                tinker.SampledSequence(
                    stop_reason="stop",
                    sequence_id=f"s{len(seqs)}",
                    tokens_np=np.array(tokens, dtype=np.int32),
                    logprobs_np=np.full(len(tokens), SAMPLER_LP, dtype=np.float32),
                )
            )
        return Done(tinker.SampleResponse(sequences=seqs))


@dataclass
class FakeTrainingClient:
    completions: list[str] = field(default_factory=lambda: ["2", "3"])
    shifts: list[float] = field(default_factory=lambda: [0.0])
    model_name: str = "fake/model"
    sample_calls: list[dict[str, Any]] = field(default_factory=list)
    optim_calls: list[tinker.AdamParams] = field(default_factory=list)
    fb_sizes: list[int] = field(default_factory=list)
    snapshots: int = 0
    since_snapshot: int = 0
    nan_at_call: int | None = None
    mismatch: float = 0.0  # trainer minus sampler log-prob before any optim step

    def __post_init__(self) -> None:
        self.tokenizer = make_tiny_tokenizer()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_info(self) -> Any:
        return SimpleNamespace(
            model_data=SimpleNamespace(model_name=self.model_name), model_name=self.model_name
        )

    def save_weights_and_get_sampling_client(self) -> Done:
        self.snapshots += 1
        self.since_snapshot = 0
        return Done(FakeSamplingClient(self.tokenizer, self.completions, self.sample_calls))

    def forward_backward_custom(self, data: list[tinker.Datum], loss_fn: Any) -> Done:
        self.fb_sizes.append(len(data))
        shift = self.shifts[min(self.snapshots - 1, len(self.shifts) - 1)] * self.since_snapshot
        logprobs_list = []
        for datum in data:
            q = datum.loss_fn_inputs["logprobs"].to_torch().float()
            lp = (q + self.mismatch + shift).clone()
            if self.nan_at_call is not None and len(self.fb_sizes) == self.nan_at_call:
                lp = lp * float("nan")
            logprobs_list.append(lp.requires_grad_(True))
        loss, metrics = loss_fn(data, logprobs_list)
        loss.backward()
        return Done(SimpleNamespace(metrics={"loss:sum": float(loss.detach())}, loss_fn_outputs=[]))

    def optim_step(self, params: tinker.AdamParams) -> Done:
        self.optim_calls.append(params)
        self.since_snapshot += 1
        return Done(SimpleNamespace(metrics={}))


def _token_tensors(data: list[tinker.Datum], logprobs_list: list[torch.Tensor]):
    for datum, lp in zip(data, logprobs_list, strict=True):
        yield (
            lp,
            datum.loss_fn_inputs["logprobs"].to_torch().float(),
            datum.loss_fn_inputs["advantages"].to_torch().float(),
            datum.loss_fn_inputs["mask"].to_torch().float() > 0,
        )


def ppo_clip_loss(eps: float = 0.2):
    """-min(r A, clip(r, 1-eps, 1+eps) A) summed; clip fraction = loss tokens where the clipped
    branch is taken (r outside the band in the direction A pushes)."""

    def loss_fn(data, logprobs_list):
        total, clipped, n, n_nonzero = 0.0, 0, 0, 0
        for lp, q, a, m in _token_tensors(data, logprobs_list):
            r = torch.exp(lp - q)
            unclipped, clip = r * a, torch.clamp(r, 1 - eps, 1 + eps) * a
            total = total - (torch.minimum(unclipped, clip) * m).sum()
            clipped += int(((clip < unclipped) & m).sum())  # never an A = 0 token
            n += int(m.sum())
            n_nonzero += int((m & (a != 0)).sum())
        return total, {
            "loss/clip_fraction": clipped / n,
            "loss/clip_fraction_nonzero_adv": clipped / n_nonzero if n_nonzero else 0.0,
        }

    return loss_fn


def tv_mask_loss(delta: float = 0.1):
    """-r A with tokens masked where (p - q) exceeds delta in the direction A pushes."""

    def loss_fn(data, logprobs_list):
        total, masked, n, n_live = 0.0, 0, 0, 0
        for lp, q, a, m in _token_tensors(data, logprobs_list):
            r = torch.exp(lp - q)
            dp = torch.exp(lp) - torch.exp(q)
            drop = ((a > 0) & (dp > delta)) | ((a < 0) & (dp < -delta))
            keep = m & ~drop
            total = total - (r * a * keep).sum() + 0.0 * lp.sum()
            masked += int((drop & m).sum())
            n += int(m.sum())
            n_live += int((m & (a != 0)).sum())
        return total, {
            "loss/clip_fraction": masked / n,
            "dppo/mask_fraction_nonzero_adv": masked / max(n_live, 1),  # drop needs A != 0
        }

    return loss_fn

"""Load an arm's loss named as code and wrap it as the loss object the preflight and the arm use.

`plan check` has already read the source with `ast` (`losslab.plan.user_loss`); here the code is
imported (a file by path, a module by name, a pinned function fetched into losslab's cache or
read from a `--source` checkout, extracted exactly as the preflight's references are and
executed in this process, since training needs its autograd graph), its signature is detected
again with `inspect.signature`, and it is wrapped as `UserLossFn`, which both the preflight and
training call:

- "tinker" `fn(data, logprobs_list, **params) -> (loss, metrics)`: the preflight builds Tinker
  datums from its fixture (`loss_fn_inputs` "logprobs", "advantages", "mask"), and training hands
  the function the backend's own datums unchanged (`tinker_custom_loss`);
- "verl" `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, ...)`:
  the per-datum tensors padded into [B, T] rows (the sampler's log-probs as `old_log_prob`, the
  bypass mode), the spec's keywords as `config` fields (with `.get`), `global_batch_info`
  defaulting to `{dp_size: 1, batch_num_tokens: 1}` so verl's token-mean is Tinker's sum;
- "losslab" `fn(batch, **params) -> LossOutput` (or `(loss, metrics)`): called on the batch.

Anything that fails (the import, the signature, a call that returns no differentiable 0-d
tensor) raises `UserLossError` naming the file, the function and what was expected.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from losslab.callspec import format_call
from losslab.conformance.pinned_runner import Config
from losslab.losses.data import TokenData
from losslab.losses.policy import LossOutput
from losslab.plan.user_loss import (
    SIGNATURES,
    SignatureInfo,
    UserLossError,
    UserLossRef,
    check_kwargs,
    detect_signature,
    inspect_source,
)

__all__ = ["UserLossError", "UserLossFn", "load_user_loss"]

VERL_SUM_BATCH_INFO = {"dp_size": 1, "batch_num_tokens": 1}
"""verl `agg_loss(..., loss_agg_mode="token-mean", **global_batch_info)` divides by
`batch_num_tokens / dp_size`; 1/1 makes it the masked sum Tinker's `forward_backward_custom`
expects (the same setting the verl and Stable-RL reference adapters use)."""
PINNED_TYPE_STUBS = ("AlgoConfig", "ActorConfig")
"""verl's config classes, which its policy losses name only in annotations and an `isinstance`
assert: bound to empty classes instead of extracted (their modules pull in the whole trainer)."""


@dataclass(frozen=True)
class UserLossFn:
    """The researcher's function with its keywords bound: what the preflight checks and the arm
    trains. Called like a `losslab.losses.LossFn` (`fn(batch) -> LossOutput`).

    `kept_D` is all True: losslab cannot see which tokens the code's own clip or mask dropped
    (the preflight infers those from exact-zero gradients, as for pinned references).
    """

    name: str
    params: dict[str, Any]
    fn: Callable[..., Any] = field(repr=False, compare=False)
    signature: str = "tinker"
    user: UserLossRef | None = field(default=None, repr=False, compare=False)
    provenance: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    code: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The code's provenance record (`UserLossRef.provenance()`, plus a pinned commit's)."""
    source_text: str = field(default="", repr=False, compare=False)
    """The source that was loaded (the file, or a pinned function's extracted definitions)."""

    def names_key(self, key: str) -> bool:
        """Whether the source names the metric `key` as a string literal (it may log it)."""
        return f'"{key}"' in self.source_text or f"'{key}'" in self.source_text

    needs_policy_inputs = True

    @property
    def spec(self) -> str:
        """The plan's text with the bound keywords (`file.py::fn(k=v, ...)`); a plan accepts it."""
        if self.user is None:
            return self.name
        head = self.user.text.split("(", 1)[0].strip()
        return head[: len(head) - len(self.name)] + format_call(
            self.name, self.params, bare_words=True
        )

    @property
    def where(self) -> str:
        return f"{self.code.get('file') or self.code.get('path') or self.name}::{self.name}"

    def __call__(
        self,
        batch: TokenData,
        *,
        num_tokens: float | None = None,
        num_sequences: float | None = None,
        norm_constant: float | None = None,
    ) -> LossOutput:
        """Evaluate on `batch` (the counts are ignored: the code reduces as it is written)."""
        if self.signature == "tinker":
            out = self.fn(datums_from_tokens(batch), list(batch.logprobs_D), **self.params)
        elif self.signature == "verl":
            out = self._call_verl(batch)
        else:
            out = self.fn(batch, **self.params)
        return self._output(out, batch)

    def tinker_custom_loss(
        self, data: list[Any], logprobs_list: list[Tensor]
    ) -> tuple[Tensor, dict[str, float]]:
        """Training's call for a Tinker-form function: the backend's datums, unchanged."""
        if self.signature != "tinker":
            out = self(TokenData.from_datums(data, logprobs_list))
            return out.loss, out.metrics
        loss, metrics = self._checked(self.fn(data, logprobs_list, **self.params))
        return loss, metrics

    def _call_verl(self, batch: TokenData) -> Any:
        pad = torch.nn.utils.rnn.pad_sequence
        log_prob = pad(list(batch.logprobs_D), batch_first=True)  # [B, T], keeps the graph
        old = pad([x.detach() for x in batch.sampler_logprobs_D], batch_first=True)
        adv = pad([x.detach() for x in batch.advantages_D], batch_first=True)
        mask = pad([x.detach().to(log_prob.dtype) for x in batch.mask_D], batch_first=True)
        accepted = set(inspect.signature(self.fn).parameters)
        direct = {k: v for k, v in self.params.items() if k in accepted and k != "config"}
        fields = {k: v for k, v in self.params.items() if k not in direct}
        fields.setdefault("global_batch_info", dict(VERL_SUM_BATCH_INFO))
        for key in ("clip_ratio_low", "clip_ratio_high"):
            fields.setdefault(key, None)  # verl: None means "use clip_ratio"
        kwargs: dict[str, Any] = {
            "old_log_prob": old,
            "log_prob": log_prob,
            "advantages": adv,
            "response_mask": mask,
            "config": Config(fields),  # attributes, .get(key, default), [key]
            **direct,
        }
        if "loss_agg_mode" in accepted:  # verl's default; with the batch info above, a sum
            kwargs["loss_agg_mode"] = self.params.get("loss_agg_mode", "token-mean")
        if "rollout_is_weights" in accepted:
            kwargs["rollout_is_weights"] = None
        return self.fn(**kwargs)

    def _checked(self, out: Any) -> tuple[Tensor, dict[str, float]]:
        if isinstance(out, LossOutput):
            loss, metrics = out.loss, out.metrics
        elif isinstance(out, tuple | list) and len(out) == 2:
            loss, metrics = out
        else:
            loss, metrics = out, {}
        if not isinstance(loss, Tensor) or loss.numel() != 1 or not loss.requires_grad:
            got = (
                f"a tensor of shape {tuple(loss.shape)} (requires_grad={loss.requires_grad})"
                if isinstance(loss, Tensor)
                else type(loss).__name__
            )
            raise UserLossError(
                f"{self.where}: returned {got}; expected a differentiable 0-d loss tensor "
                "(with metrics: (loss, {name: float}))"
            )
        if not isinstance(metrics, Mapping):
            raise UserLossError(
                f"{self.where}: returned metrics of type {type(metrics).__name__}; expected a "
                "dict {name: float}"
            )
        return loss.reshape(()), {str(k): float(v) for k, v in metrics.items()}

    def _output(self, out: Any, batch: TokenData) -> LossOutput:
        loss, metrics = self._checked(out)
        kept_D = [torch.ones(len(x), dtype=torch.bool) for x in batch.logprobs_D]
        return LossOutput(loss=loss, metrics=metrics, kept_D=kept_D)


def datums_from_tokens(batch: TokenData) -> list[Any]:
    """Tinker datums holding `batch`'s inputs as the engine writes them (`losslab.engine.datums`:
    "target_tokens", "logprobs" = the sampler's, "advantages", "mask")."""
    import tinker

    out = []
    for d, lp_T in enumerate(batch.logprobs_D):
        n = len(lp_T)
        inputs = {
            "target_tokens": tinker.TensorData.from_torch(torch.zeros(n, dtype=torch.int64)),
            "logprobs": tinker.TensorData.from_torch(batch.sampler_logprobs_D[d].detach().float()),
            "advantages": tinker.TensorData.from_torch(batch.advantages_D[d].detach().float()),
            "mask": tinker.TensorData.from_torch(batch.mask_D[d].detach().float()),
        }
        out.append(
            tinker.Datum(model_input=tinker.ModelInput.from_ints([0] * n), loss_fn_inputs=inputs)
        )
    return out


def load_user_loss(
    ref: UserLossRef,
    *,
    params: Mapping[str, Any] | None = None,
    sources: Mapping[str, Path] | None = None,
    offline: bool = False,
) -> UserLossFn:
    """Import the code `ref` names and wrap it (module docstring).

    Args:
        ref: the arm's `ResolvedLoss.user`.
        params: the keywords to bind (default `ref.kwargs`): the arm's `ResolvedLoss.values`, so
            a changed resolved value changes what is checked and trained alike.
        sources: `{"owner/repo": checkout}` for a pinned function (the `--source` override);
            otherwise its commit is fetched into losslab's cache (`conformance.fetch`).
        offline: never fetch (a cached commit is still used).
    """
    if params is not None:
        ref = replace(ref, kwargs=dict(params))
    if ref.kind == "pinned":
        fn, pinned, info = _load_pinned(ref, sources or {}, offline)
        ref = replace(ref, signature=info, sha256=pinned["sha256"])
        text = pinned.pop("source_text")
        code = {**ref.provenance(), **pinned}
        where = f"{ref.repo}@{(ref.commit or '')[:12]}:{ref.path}"
    else:
        fn = _load_file(ref) if ref.kind == "file" else _load_module(ref)
        where = str(ref.file)
        code = ref.provenance()
        text = Path(str(ref.file)).read_text(encoding="utf-8")
    kind = _signature_kind(fn, ref, where)
    loss = UserLossFn(
        name=ref.function,
        params=dict(ref.kwargs),
        fn=fn,
        signature=kind,
        user=ref,
        provenance={k: "plan" for k in ref.kwargs},
        code=code,
        source_text=text,
    )
    _probe(loss)
    return loss


def _probe(loss: UserLossFn) -> None:
    """Call the code once on a two-token batch, so a function that raises or returns no
    differentiable loss fails now (before any run directory), not at the preflight or the first
    training step."""
    logprobs_T = torch.tensor([-0.5, -1.2], requires_grad=True)
    batch = TokenData(
        logprobs_D=[logprobs_T],
        sampler_logprobs_D=[torch.tensor([-0.6, -1.0])],
        advantages_D=[torch.tensor([1.0, 1.0])],
        mask_D=[torch.tensor([1.0, 1.0])],
    )
    try:
        out = loss(batch)
    except UserLossError:
        raise
    except Exception as exc:  # the user's code
        raise UserLossError(
            f"{loss.where}: calling it on a 2-token probe batch raised {type(exc).__name__}: "
            f"{exc}; expected {SIGNATURES[loss.signature]}"
        ) from None
    (grad_T,) = torch.autograd.grad(out.loss, logprobs_T, allow_unused=True)
    if grad_T is None:
        raise UserLossError(
            f"{loss.where}: its loss has no gradient path to the log-probs it was given; expected "
            "a loss computed from logprobs_list (or log_prob / batch.logprobs_D)"
        )


def _signature_kind(fn: Any, ref: UserLossRef, where: str) -> str:
    """The form of `fn` by `inspect.signature` (the same rules as plan check's `ast` reading)."""
    label = f"{where}::{ref.function}"
    if not callable(fn):
        raise UserLossError(f"{label}: is a {type(fn).__name__}, not a function")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise UserLossError(f"{label}: its signature cannot be read ({exc})") from None
    P = inspect.Parameter
    ps = list(sig.parameters.values())
    positional = [p.name for p in ps if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    required_pos = [
        p.name
        for p in ps
        if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD) and p.default is P.empty
    ]
    kwonly = [p.name for p in ps if p.kind is P.KEYWORD_ONLY]
    kwonly_req = [p.name for p in ps if p.kind is P.KEYWORD_ONLY and p.default is P.empty]
    fields: tuple[str, ...] = ()
    if ref.signature is not None:
        fields = ref.signature.config_fields
    info = detect_signature(
        positional,
        required_pos,
        kwonly,
        kwonly_req,
        var_keyword=any(p.kind is P.VAR_KEYWORD for p in ps),
        where=label,
        config_fields=fields,
    )
    check_kwargs(info, ref.kwargs, label)
    return info.kind


def _load_file(ref: UserLossRef) -> Any:
    path = Path(str(ref.file))
    # a name of its own per file content: two plans' files never share a module object
    name = f"losslab_user_code.{path.stem}_{(ref.sha256 or '')[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserLossError(f"{path}::{ref.function}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any failure is theirs to see, without our stack
        sys.modules.pop(name, None)
        raise UserLossError(
            f"{path}::{ref.function}: importing the file failed ({type(exc).__name__}: {exc}); "
            "expected a Python file that imports"
        ) from None
    return _attribute(module, ref, str(path))


def _load_module(ref: UserLossRef) -> Any:
    try:
        module = importlib.import_module(str(ref.module))
    except Exception as exc:  # the user's code
        raise UserLossError(
            f"{ref.module}:{ref.function} ({ref.file}): importing the module failed "
            f"({type(exc).__name__}: {exc}); expected an importable module"
        ) from None
    return _attribute(module, ref, str(ref.file))


def _attribute(module: Any, ref: UserLossRef, where: str) -> Any:
    fn = getattr(module, ref.function, None)
    if fn is None:
        raise UserLossError(f"{where}: defines no {ref.function!r} once imported")
    return fn


def _load_pinned(
    ref: UserLossRef, sources: Mapping[str, Path], offline: bool
) -> tuple[Any, dict[str, Any], SignatureInfo]:
    """Fetch (or read from `--source`) the pinned commit, check its source with `ast` as plan
    check checks a file, extract the function as the preflight's references are extracted, and
    execute the extraction here."""
    from losslab.conformance.fetch import fetch_pinned
    from losslab.conformance.pinned import GitFiles, PinnedSourceError, extract
    from losslab.conformance.pinned_runner import _load
    from losslab.plan import parse_revision

    revision = parse_revision(f"{ref.repo}@{ref.commit}:{ref.path}::{ref.function}")
    label = f"{ref.repo}@{(ref.commit or '')[:12]}:{ref.path}::{ref.function}"
    try:
        checkout = sources.get(str(ref.repo))
        files = (
            GitFiles(Path(checkout), revision)
            if checkout is not None
            else fetch_pinned(revision, offline=offline)
        )
        text = files.read(str(ref.path))
        if text is None:
            raise UserLossError(f"{label}: {ref.path} is not in commit {ref.commit}")
        info = inspect_source(text, ref.function, label, ref.kwargs)
        modules = extract(files, ref.function, stub_names=PINNED_TYPE_STUBS)
    except PinnedSourceError as exc:
        raise UserLossError(f"{label}: {exc}") from None
    try:
        spaces = _load({"modules": [m.to_dict() for m in modules]})
    except Exception as exc:  # the pinned code, executed as extracted
        raise UserLossError(
            f"{label}: executing the extracted source failed ({type(exc).__name__}: {exc})"
        ) from None
    root = next(m for m in modules if m.path == ref.path)
    fn = spaces[root.module].get(ref.function)
    record = {
        "sha256": root.sha256,
        "commit": files.commit,
        "obtained": getattr(files, "obtained", f"checkout {checkout}"),
        "extracted": {m.path: m.sha256 for m in modules},
        "summary": f"pinned code: {label} (file sha256 {root.sha256[:12]})",
        "source_text": "\n".join(m.code for m in modules),
    }
    return fn, record, info

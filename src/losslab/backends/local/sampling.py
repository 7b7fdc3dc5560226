"""`LocalSamplingClient`: batched, KV-cached sampling from a frozen model snapshot.

Batching. `sample()` validates its arguments, queues the request and returns a lazy future.
When any pending future's result is requested, *all* pending requests of that client are run as
one batched generation (in chunks of `max_batch_rows` sequences): each request's prompt is
prefilled once (left-padded with the other prompts), its cache rows are repeated for its
`num_samples`, and finished rows are dropped from the batch at every step. Only the last
position's logits are computed (`logits_to_keep=1`), and only the sampled token's log-prob is kept.

Caches. Row selection goes through the cache's own `reorder_cache(index)` (transformers' beam-
search API: an `index_select` on the batch axis of every state a layer holds), which every layer
kind of transformers' `DynamicCache` implements: KV (`DynamicLayer`), sliding window
(`DynamicSlidingWindowLayer`), linear attention (`LinearAttentionLayer`: conv and recurrent
states, Qwen3.5 / Qwen3-Next Gated DeltaNet) and the hybrids. `batch_select_indices` is not
used: linear-attention layers lack it, and on a hybrid layer it would select the KV part only.
A cache that offers no `reorder_cache` on every layer takes the plain path instead: every row is
prefilled with its own copy of the prompt and no row is dropped (finished rows keep decoding,
their tokens discarded), which is correct for any cache, just slower.

Speed. A generation of at least `MERGE_MIN_TOKENS` planned tokens decodes with the LoRA
weights merged into plain Linears (`merged_lora_linears`, swapped back afterwards), full-
attention cache layers grow in place (`GrowingKVLayer`), logits are formed vocabulary-major,
and freed blocks stay in the heap for reuse (`memory.keep_freed_memory`: a decode step's 12.6
MB logits and softmax buffers no longer fault in anew at every step, and the training pass after
a flush reuses its pages; `memory.after_sampling` returns them only where the heap is not kept).

Seeds. Every sequence has its own `torch.Generator`, so batching does not change which random
numbers it sees: sample j of a request with `SamplingParams.seed = s` uses
`SeedSequence([s, j])`; with `seed=None` it uses `SeedSequence([client_seed, k, j])`, where k
counts the `sample()` calls on this client (0, 1, ...) and `client_seed` derives from the
training client's seed and snapshot index. Each decode step draws exactly one uniform u per
sequence and picks the token by inverse CDF over the (filtered) probabilities, so queued-then-
batched and one-by-one runs draw the same numbers; they give the same tokens up to the float
round-off of different batch shapes (identical in the tests).

Temperature convention. The returned per-token log-probs are those of the *tempered* distribution
`log_softmax(logits / T)` at the sampling temperature T, before top-k/top-p truncation. At T = 1
they equal `compute_logprobs` on the same tokens (checked to 1e-5 in the tests). Greedy decoding
(T = 0) returns the T = 1 log-probs of the argmax tokens.

Stops: `stop=None` stops at the tokenizer's EOS ids, `[]` never stops early, a list of ints
stops at those token ids, a string / list of strings stops once the decoded completion contains
one. The stop token(s) are included in `tokens` (as Tinker does) with `stop_reason="stop"`;
running out of `max_tokens` gives `"length"`. `max_tokens=None` means `DEFAULT_MAX_TOKENS`,
capped by the model's context length.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tinker import types
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from losslab.backends.futures import CompletedFuture, LazyFuture
from losslab.backends.local.fused import plain_lora_layers, swapped_modules
from losslab.backends.local.linear_attention import install_for, value_major_states
from losslab.backends.local.logprobs import (
    plain_unembedding,
    sequence_logprobs,
    unembedding_logits,
)
from losslab.backends.local.memory import after_sampling
from losslab.backends.local.packed import PackedLinear, pack, packing_available
from losslab.backends.local.sdk_surface import SamplingClientSurface

DEFAULT_MAX_TOKENS = 512


def derive_seed(*entropy: int) -> int:
    """A 63-bit torch seed from integers via numpy's SeedSequence (well mixed, platform-stable)."""
    return int(
        np.random.SeedSequence([int(e) & (2**64 - 1) for e in entropy]).generate_state(
            1, np.uint64
        )[0]
    ) & (2**63 - 1)


def rows_selectable(cache: Any) -> bool:
    """True when every layer of `cache` can select / repeat batch rows with `reorder_cache`
    (all layer kinds of transformers' DynamicCache); False for caches without that API."""
    if not callable(getattr(cache, "reorder_cache", None)):
        return False
    layers = getattr(cache, "layers", None)
    if layers is None:  # a cache object without per-layer storage: trust its own method
        return True
    return all(callable(getattr(layer, "reorder_cache", None)) for layer in layers)


MERGE_MIN_TOKENS = 256  # below this many planned tokens, merging costs more than it saves


@contextmanager
def merged_lora_linears(lm: torch.nn.Module) -> Iterator[bool]:
    """Inside the block, each LoRA Linear of `lm` is swapped for a plain Linear holding the
    merged weight `W + scale * B @ A` (one `addmm` into the base weight's own (out, in) layout,
    a straight copy: ~0.1 s for SmolLM2-135M where an input-major copy, a transpose, took
    ~0.4 s); the LoRA modules are put back on exit. Decoding then runs one matmul per
    projection instead of three plus a scale and an add, on 2 CPU threads ~25% less time per
    step (the merged weights take 0.4 GB on SmolLM2-135M, freed on exit).

    Only for a model no one else runs meanwhile: a sampling client's own snapshot, under its
    lock. Yields False (nothing swapped) when the LoRA layers are of another kind. The merged
    forward equals the LoRA forward up to float round-off (compute_logprobs to 1e-5 in tests).
    """
    lora = plain_lora_layers(lm)
    if lora is None:
        yield False
        return
    with torch.no_grad():
        merged = [(name, _merged_linear(m)) for name, m in lora]
    with swapped_modules(lm, merged):
        yield True


def _merged_linear(m: Any) -> torch.nn.Module:
    """A plain Linear holding a plain LoRA Linear's `W + scale * B @ A`; on the CPU a
    `PackedLinear` of it (oneDNN's layout, `packed.py`: the dense merged weight is freed)."""
    adapter = m.active_adapters[0]
    base = m.base_layer
    w_out_in = torch.addmm(
        base.weight, m.lora_B[adapter].weight, m.lora_A[adapter].weight, alpha=m.scaling[adapter]
    )
    if packing_available(w_out_in):
        return PackedLinear(w_out_in, base.bias)
    linear = torch.nn.Linear(base.in_features, base.out_features, bias=False, device="meta")
    linear.weight = torch.nn.Parameter(w_out_in, requires_grad=False)
    linear.bias = base.bias
    return linear


class GrowingKVLayer(DynamicLayer):
    """transformers' `DynamicLayer` with spare room on the sequence axis: `keys` / `values` are
    views into buffers of `capacity` positions, so a decode step writes its one token in place
    instead of concatenating (copying) the layer's whole cache, which cost ~15% of a decode step
    on SmolLM2 at batch 40. Row selection (`reorder_cache`) replaces the views by compact
    tensors, and the next update re-buffers them."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = int(capacity)
        self._key_buf: torch.Tensor | None = None
        self._value_buf: torch.Tensor | None = None

    def _buffered(self) -> bool:
        return (
            self._key_buf is not None
            and self._value_buf is not None
            and self.keys.numel() > 0
            and self.keys.data_ptr() == self._key_buf.data_ptr()
            and self.keys.shape[0] == self._key_buf.shape[0]
            and self.values.data_ptr() == self._value_buf.data_ptr()
        )

    def update(self, key_states, value_states, *args, **kwargs):  # type: ignore[override]
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        end = n + key_states.shape[-2]
        if not self._buffered() or end > self._key_buf.shape[-2]:  # type: ignore[union-attr]
            room = max(self.capacity, end)
            b, h, _, d = key_states.shape
            self._key_buf = key_states.new_empty((b, h, room, d))
            self._value_buf = value_states.new_empty((b, h, room, value_states.shape[-1]))
            if n:
                self._key_buf[:, :, :n] = self.keys
                self._value_buf[:, :, :n] = self.values
        self._key_buf[:, :, n:end] = key_states  # type: ignore[index]
        self._value_buf[:, :, n:end] = value_states  # type: ignore[index]
        self.keys = self._key_buf[:, :, :end]  # type: ignore[index]
        self.values = self._value_buf[:, :, :end]  # type: ignore[index]
        return self.keys, self.values


def _select_rows(cache: Any, index: torch.Tensor) -> None:
    """Keep / repeat the cache's batch rows `index` (`reorder_cache`), its Gated-DeltaNet
    states then stored value-major again (`index_select` makes them contiguous): the layout the
    CPU decode step reads fastest (`linear_attention.value_major_states`)."""
    cache.reorder_cache(index)
    value_major_states(cache)


def decode_cache(lm: torch.nn.Module, capacity: int) -> Any:
    """A `DynamicCache` for `lm` whose plain full-attention layers are `GrowingKVLayer`s of
    `capacity` positions (other layer kinds, sliding-window or linear-attention, as
    transformers builds them); None (the model builds its own) when the cache has no layers."""
    try:
        cache = DynamicCache(config=lm.config)
    except Exception:  # a config this transformers cannot build a cache from
        return None
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = GrowingKVLayer(capacity)
    return cache


@dataclass
class _Row:
    request: int
    prompt: tuple[int, ...]
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_tokens: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: str | None = None


@dataclass
class _Request:
    index: int
    prompt: list[int]
    num_samples: int
    params: types.SamplingParams
    include_prompt_logprobs: bool
    future: LazyFuture[types.SampleResponse]


class LocalSamplingClient(SamplingClientSurface):
    """Tinker-shaped sampling client over a frozen snapshot of a (LoRA) model."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        base_model: str,
        tokenizer: Any,
        seed: int,
        label: str,
        max_batch_rows: int = 64,
        max_tokens_per_batch: int = 8192,
    ) -> None:
        self._model = model
        self._lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._base_model = base_model
        self._tokenizer = tokenizer
        self._seed = int(seed)
        self._label = label
        self._max_batch_rows = max_batch_rows
        self._max_tokens_per_batch = max_tokens_per_batch
        self._device = next(model.parameters()).device
        self._vocab = int(self._lm.get_output_embeddings().weight.shape[0])
        self._context = int(getattr(self._lm.config, "max_position_embeddings", 1 << 30))
        self._lock = threading.RLock()
        self._pending: list[_Request] = []
        self._requests = 0
        self._eos_ids = self._find_eos_ids()
        forward_params = inspect.signature(self._lm.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self._plain_head = plain_unembedding(self._lm) and callable(
            getattr(self._lm, "get_decoder", None)
        )
        install_for(self._lm)  # Gated-DeltaNet layers decode through `linear_attention`
        self._packed_head: torch.Tensor | None = None  # the unembedding packed, while decoding

    def __repr__(self) -> str:
        return f"LocalSamplingClient({self._label!r}, base_model={self._base_model!r})"

    def _find_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        tok_eos = getattr(self._tokenizer, "eos_token_id", None)
        if isinstance(tok_eos, int):
            ids.add(tok_eos)
        gen_cfg = getattr(self._lm, "generation_config", None)
        gen_eos = getattr(gen_cfg, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, list | tuple):
            ids.update(int(t) for t in gen_eos)
        return frozenset(ids)

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._base_model

    # ------------------------------------------------------------------ requests
    def _check_prompt(self, prompt: Any, arg: str = "prompt") -> list[int]:
        if not isinstance(prompt, types.ModelInput):
            raise ValueError(f"{arg} must be tinker.types.ModelInput, got {type(prompt).__name__}")
        try:
            ids = prompt.to_ints()
        except Exception as exc:
            raise ValueError(f"{arg} cannot be read as token ids ({exc})") from exc
        if not ids:
            raise ValueError(f"{arg} is empty; expected at least one token")
        bad = [t for t in ids if not 0 <= t < self._vocab]
        if bad:
            raise ValueError(
                f"{arg} has token id {bad[0]} outside the vocabulary [0, {self._vocab})"
            )
        return ids

    def _check_params(self, p: Any, prompt_len: int) -> types.SamplingParams:
        if not isinstance(p, types.SamplingParams):
            raise ValueError(
                f"sampling_params must be tinker.types.SamplingParams, got {type(p).__name__}"
            )
        if p.temperature < 0:
            raise ValueError(f"sampling_params.temperature = {p.temperature}; expected >= 0")
        if not 0 <= p.top_p <= 1:
            raise ValueError(f"sampling_params.top_p = {p.top_p}; expected a value in [0, 1]")
        if p.top_k < -1:
            raise ValueError(f"sampling_params.top_k = {p.top_k}; expected -1 (off) or >= 0")
        if p.max_tokens is not None and p.max_tokens < 1:
            raise ValueError(f"sampling_params.max_tokens = {p.max_tokens}; expected >= 1 or None")
        if prompt_len >= self._context:
            raise ValueError(
                f"prompt has {prompt_len} tokens; the model's context is {self._context}"
            )
        stop = p.stop
        if stop is not None and not isinstance(stop, str):
            kinds = {type(s) for s in stop}
            if kinds and not (kinds <= {int} or kinds <= {str}):
                raise ValueError(
                    f"sampling_params.stop = {stop!r}; expected a string, a list of strings or "
                    "a list of token ids, not a mix"
                )
        return p

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        **unsupported: Any,
    ) -> LazyFuture[types.SampleResponse]:
        """Queue `num_samples` completions of `prompt`; they run (batched with the other queued
        requests) when any queued result is requested."""
        ids = self._check_prompt(prompt)
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        params = self._check_params(sampling_params, len(ids))
        if topk_prompt_logprobs:
            raise ValueError("topk_prompt_logprobs is not supported by the local backend; pass 0")
        used = {k: v for k, v in unsupported.items() if v not in (None, 0, False)}
        if used:
            raise ValueError(f"sample() options not supported by the local backend: {sorted(used)}")
        with self._lock:
            future: LazyFuture[types.SampleResponse] = LazyFuture(
                self._flush, queued=lambda: self._requests
            )
            self._pending.append(
                _Request(self._requests, ids, num_samples, params, include_prompt_logprobs, future)
            )
            self._requests += 1
        return future

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> CompletedFuture[list[float | None]]:
        """`[None] + [log p(tok_i | tok_<i) for i >= 1]` at temperature 1 (no sampling)."""
        ids = self._check_prompt(prompt)
        lps = self._prompt_logprobs(ids)
        if prompt_logprobs_last_n is not None:
            lps = [None] * (len(lps) - prompt_logprobs_last_n) + lps[-prompt_logprobs_last_n:]
        return CompletedFuture(lps)

    def _prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        if len(ids) < 2:
            return [None] * len(ids)
        with self._lock, torch.no_grad():
            (lp,) = sequence_logprobs(
                self._model,
                [ids[:-1]],
                [torch.tensor(ids[1:])],
                device=self._device,
                max_tokens_per_batch=self._max_tokens_per_batch,
            )
        return [None] + [float(x) for x in lp.cpu()]

    # ------------------------------------------------------------------ batched generation
    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                responses = self._run(batch)
            except Exception as exc:
                for req in batch:
                    req.future.set_error(exc)
                raise
            for req, resp in zip(batch, responses, strict=True):
                req.future.set_result(resp)
            after_sampling()  # merged weights, caches, logits: kept for training, or to the OS

    def _rows_for(self, b: int, req: _Request) -> list[_Row]:
        p = req.params
        if p.stop is None:
            stop_ids, stop_strings = self._eos_ids, ()
        elif isinstance(p.stop, str):
            stop_ids, stop_strings = frozenset(), (p.stop,)
        elif all(isinstance(s, str) for s in p.stop):
            stop_ids, stop_strings = frozenset(), tuple(p.stop)  # type: ignore[arg-type]
        else:
            stop_ids, stop_strings = frozenset(int(s) for s in p.stop), ()
        cap = self._context - len(req.prompt)
        max_tokens = min(p.max_tokens if p.max_tokens is not None else DEFAULT_MAX_TOKENS, cap)
        rows = []
        for j in range(req.num_samples):
            seed = (
                derive_seed(p.seed, j)
                if p.seed is not None
                else derive_seed(self._seed, req.index, j)
            )
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            rows.append(
                _Row(
                    request=b,
                    prompt=tuple(req.prompt),
                    temperature=float(p.temperature),
                    top_k=int(p.top_k),
                    top_p=float(p.top_p),
                    stop_ids=stop_ids,
                    stop_strings=stop_strings,
                    max_tokens=max_tokens,
                    generator=gen,
                )
            )
        return rows

    def _run(self, batch: list[_Request]) -> list[types.SampleResponse]:
        rows: list[_Row] = []
        for b, req in enumerate(batch):
            rows.extend(self._rows_for(b, req))
        merge = sum(r.max_tokens for r in rows) >= MERGE_MIN_TOKENS
        # inference mode, not just no_grad: a generation is ~100k small ops, and each skips the
        # autograd and view/version-counter dispatch keys: 1-4 % less time a generation in two
        # alternating in-process runs (Qwen3.5 bench model, 8 x 8 x 32 tokens, 2026-12-06).
        # Nothing made in the block outlives it (merged weights, caches, the packed head).
        with torch.inference_mode(), merged_lora_linears(self._lm) if merge else nullcontext():
            head = self._lm.get_output_embeddings().weight if merge and self._plain_head else None
            if head is not None and packing_available(head):
                self._packed_head = pack(head)  # for this generation only (`packed.py`)
            try:
                for s in range(0, len(rows), self._max_batch_rows):
                    self._generate(rows[s : s + self._max_batch_rows])
            finally:
                self._packed_head = None
        responses = []
        for b, req in enumerate(batch):
            seqs = [
                types.SampledSequence(
                    stop_reason=r.stop_reason,  # type: ignore[arg-type]
                    sequence_id=f"{self._label}/{req.index}/{j}",
                    tokens_np=np.asarray(r.tokens, dtype=np.int32),
                    logprobs_np=np.asarray(r.logprobs, dtype=np.float32),
                )
                for j, r in enumerate(x for x in rows if x.request == b)
            ]
            prompt_lp = None
            if req.include_prompt_logprobs:
                lps = self._prompt_logprobs(req.prompt)
                prompt_lp = np.asarray([np.nan if x is None else x for x in lps], dtype=np.float32)
            responses.append(types.SampleResponse(sequences=seqs, prompt_logprobs_np=prompt_lp))
        return responses

    def _forward(self, ids, mask, pos, cache):
        # transformers renamed `past_key_values` to `cache` (deprecated name kept until 5.40)
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        kwargs[self._cache_kwarg] = cache
        if self._plain_head:  # logits = h W^T (`unembedding_logits`: the CPU's fast forms)
            out = self._lm.get_decoder()(**kwargs)
            w_V_H = self._lm.get_output_embeddings().weight
            logits_A_V = unembedding_logits(w_V_H, out[0][:, -1, :], self._packed_head)
        else:
            out = self._lm(**kwargs, logits_to_keep=1)
            logits_A_V = out.logits[:, -1, :]
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return logits_A_V, new_cache

    def _generate(self, rows: list[_Row]) -> None:
        """Decode `rows` in place: prefill each distinct prompt once, repeat its cache rows,
        then one token per step for the rows still running."""
        dev = self._device
        prompts: dict[tuple[int, ...], int] = {}
        for r in rows:
            prompts.setdefault(r.prompt, len(prompts))
        longest = max(len(p) for p in prompts)
        ids_P_L = torch.zeros((len(prompts), longest), dtype=torch.long)
        mask_P_L = torch.zeros((len(prompts), longest), dtype=torch.long)
        for p, i in prompts.items():  # left padding so every row's next token is at the end
            ids_P_L[i, longest - len(p) :] = torch.tensor(p)
            mask_P_L[i, longest - len(p) :] = 1
        pos_P_L = (mask_P_L.cumsum(-1) - 1).clamp(min=0)
        sel = torch.tensor([prompts[r.prompt] for r in rows], device=dev)
        ids_P_L, mask_P_L, pos_P_L = ids_P_L.to(dev), mask_P_L.to(dev), pos_P_L.to(dev)
        capacity = longest + max(r.max_tokens for r in rows)
        logits_P_V, cache = self._forward(
            ids_P_L, mask_P_L, pos_P_L, decode_cache(self._lm, capacity)
        )
        selectable = rows_selectable(cache)
        if selectable:  # the group's prompt was prefilled once; repeat its cache rows
            _select_rows(cache, sel)
        else:
            if len(prompts) != len(rows):  # no row surgery: prefill every row's own copy
                ids_P_L, mask_P_L, pos_P_L = ids_P_L[sel], mask_P_L[sel], pos_P_L[sel]
                logits_P_V, cache = self._forward(
                    ids_P_L, mask_P_L, pos_P_L, decode_cache(self._lm, capacity)
                )
                sel = torch.arange(len(rows), device=dev)
            value_major_states(cache)  # the decode step's faster layout (CPU Gated DeltaNet)
        logits_A_V = logits_P_V[sel]
        mask_A_L = mask_P_L[sel]
        next_pos_A = pos_P_L[sel, -1] + 1
        active = list(range(len(rows)))
        running = list(range(len(rows)))  # rows still in the batch (finished ones too, if kept)
        while True:
            # `running` indexes the batch; `active` are the rows still generating (a subset
            # only on the plain path, where finished rows stay in the batch)
            at = [running.index(i) for i in active]
            if at != list(range(logits_A_V.shape[0])):  # all rows: no (A, V) gather copy
                logits_A_V = logits_A_V[at]
            tok_A, lp_A = self._pick(logits_A_V, [rows[i] for i in active])
            keep: list[int] = []
            # one conversion each, not an `int(...)` / `float(...)` per row
            for a, (i, t, lp) in enumerate(zip(active, tok_A.tolist(), lp_A.tolist(), strict=True)):
                r = rows[i]
                r.tokens.append(t)
                r.logprobs.append(lp)
                if t in r.stop_ids or (
                    r.stop_strings
                    and any(s in self._tokenizer.decode(r.tokens) for s in r.stop_strings)
                ):
                    r.stop_reason = "stop"
                elif len(r.tokens) >= r.max_tokens:
                    r.stop_reason = "length"
                else:
                    keep.append(a)
            if not keep:
                return
            active = [active[a] for a in keep]
            if selectable and len(active) < len(running):
                idx = torch.tensor([running.index(i) for i in active], device=dev)
                _select_rows(cache, idx)
                mask_A_L, next_pos_A = mask_A_L[idx], next_pos_A[idx]
                running = list(active)
            tok_A = torch.tensor([rows[i].tokens[-1] for i in running], device=dev)
            mask_A_L = torch.cat([mask_A_L, mask_A_L.new_ones((len(running), 1))], dim=1)
            logits_A_V, cache = self._forward(
                tok_A[:, None].to(dev), mask_A_L, next_pos_A[:, None], cache
            )
            next_pos_A = next_pos_A + 1

    @staticmethod
    def _pick(logits_A_V: torch.Tensor, rows: Sequence[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row by inverse CDF with the row's own uniform draw; returns the tokens
        and their log-probs under log_softmax(logits / T) (T = 1 for greedy rows)."""
        # one contiguous float copy: the vocabulary-major logits arrive as a transposed view,
        # and every row-wise op below (softmax, cumsum) runs several times faster on rows
        logits_A_V = logits_A_V.float().contiguous()
        dev = logits_A_V.device
        temps = [r.temperature for r in rows]
        temp_A = torch.tensor(temps, device=dev)
        greedy_A = temp_A == 0
        if any(t not in (0.0, 1.0) for t in temps):  # x / 1 == x: skip the (A, V) division
            logits_A_V = logits_A_V / torch.where(greedy_A, 1.0, temp_A)[:, None]
        logp_A_V = torch.log_softmax(logits_A_V, -1)
        probs_A_V = logp_A_V.exp()
        top_k_A = torch.tensor([r.top_k if r.top_k > 0 else 0 for r in rows], device=dev)
        top_p_A = torch.tensor([r.top_p for r in rows], device=dev)
        if bool((top_k_A > 0).any()) or bool((top_p_A < 1).any()):
            vocab = probs_A_V.shape[-1]
            sorted_A_V, order_A_V = probs_A_V.sort(dim=-1, descending=True, stable=True)
            rank_V = torch.arange(vocab, device=dev)
            k_A = torch.where(top_k_A > 0, top_k_A, vocab)
            keep_A_V = rank_V[None, :] < k_A[:, None]
            before_A_V = sorted_A_V.cumsum(-1) - sorted_A_V  # mass strictly above this token
            keep_A_V &= (before_A_V < top_p_A[:, None]) | (top_p_A[:, None] >= 1)
            keep_A_V[:, 0] = True
            probs_A_V = torch.zeros_like(probs_A_V).scatter(-1, order_A_V, sorted_A_V * keep_A_V)
        u_A = torch.tensor([float(torch.rand((), generator=r.generator)) for r in rows], device=dev)
        cdf_A_V = probs_A_V.cumsum(-1)
        x_A = u_A * cdf_A_V[:, -1]
        tok_A = torch.searchsorted(cdf_A_V, x_A[:, None], right=True).squeeze(-1)
        tok_A = tok_A.clamp(max=probs_A_V.shape[-1] - 1)
        if 0.0 in temps:
            tok_A = torch.where(greedy_A, logits_A_V.argmax(-1), tok_A)
        return tok_A, logp_A_V.gather(-1, tok_A[:, None]).squeeze(-1)

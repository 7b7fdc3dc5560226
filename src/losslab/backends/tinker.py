"""The Tinker service through the official SDK (tinker 0.38.0), with losslab's conventions.

* The API key comes only from the `TINKER_API_KEY` environment variable; it is handed to the SDK
  and never stored on, or printed by, these wrappers.
* Built-in `forward_backward`/`forward` send only what the server loss reads (`target_tokens`
  and that loss's inputs): client-only keys such as `mask` are stripped, config keys checked.
* Custom losses go through the SDK's `forward_backward_custom` (two-phase surrogate): advantages,
  sampler log-probs and masks stay client-side and reach the loss function through `data`.
* `optim_step()` without arguments uses the client's configured AdamParams (set at creation with
  `adam_params=`, updated by every explicit `optim_step(params)`), like the local backend;
  `optimizer_config()` reports it for the restoration preflight.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tinker import types

from losslab.backends.datums import check_builtin, check_data, tinker_visible

API_KEY_ENV = "TINKER_API_KEY"


class TinkerKeyError(RuntimeError):
    """TINKER_API_KEY is not set."""


def api_key_from_env() -> str:
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise TinkerKeyError(
            f"{API_KEY_ENV} is not set; the tinker backend reads the API key only from that "
            "environment variable (or choose another backend from losslab.backends.BACKENDS)"
        )
    return key


def builtin_request(
    data: Sequence[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float] | None
) -> tuple[list[types.Datum], dict[str, float] | None]:
    """The datums and config a built-in `forward_backward` sends: validated, client-only keys
    removed, config values as floats (None when empty, as the SDK default)."""
    batch = check_data(data)
    config = check_builtin(loss_fn, batch, loss_fn_config)
    return [tinker_visible(d, loss_fn) for d in batch], (config or None)


class TinkerTrainingClient:
    """Wraps `tinker.TrainingClient`; unknown attributes pass through to the SDK client."""

    def __init__(
        self,
        sdk_client: Any,
        adam_params: types.AdamParams | None = None,
        *,
        url: str = "",
        call_timeout_s: float | None = None,
    ) -> None:
        self._sdk = sdk_client
        self._adam = adam_params if adam_params is not None else types.AdamParams()
        self._url = url
        self._call_timeout_s = call_timeout_s

    def _bounded(self, what: str, future: Any) -> Any:
        wrap = self._sampling_client if what in _SAMPLING_CLIENT_CALLS else None
        return BoundedFuture(future, what, self._url, self._call_timeout_s, wrap)

    def _sampling_client(self, sdk_sampler: Any) -> TinkerSamplingClient:
        return TinkerSamplingClient(sdk_sampler, self._url, self._call_timeout_s)

    def __repr__(self) -> str:
        return f"TinkerTrainingClient({type(self._sdk).__name__})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._sdk, name)
        if name in _BOUNDED_SDK_CALLS:
            return lambda *a, **k: self._bounded(name, attr(*a, **k))
        return attr

    def forward(
        self,
        data: Sequence[types.Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, float] | None = None,
    ) -> Any:
        batch, config = builtin_request(data, loss_fn, loss_fn_config)
        return self._bounded("forward", self._sdk.forward(batch, loss_fn, config))

    def forward_backward(
        self,
        data: Sequence[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float] | None = None,
    ) -> Any:
        batch, config = builtin_request(data, loss_fn, loss_fn_config)
        return self._bounded("forward_backward", self._sdk.forward_backward(batch, loss_fn, config))

    def forward_backward_custom(
        self, data: Sequence[types.Datum], loss_fn: Callable[..., Any], **kwargs: Any
    ) -> Any:
        future = self._sdk.forward_backward_custom(check_data(data), loss_fn, **kwargs)
        return self._bounded("forward_backward_custom", future)

    def optim_step(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> Any:
        params = optim_params if optim_params is not None else adam_params
        if params is not None:
            if not isinstance(params, types.AdamParams):
                raise ValueError(f"optim_params must be AdamParams, got {type(params).__name__}")
            self._adam = params
        return self._bounded("optim_step", self._sdk.optim_step(self._adam))

    def optimizer_config(self) -> dict[str, Any]:
        """The optimizer family the service reports (get_info) and the AdamParams the next
        `optim_step()` sends."""
        family = getattr(self._sdk.get_info().optimizer_config, "type", "unknown")
        return {
            "type": family,
            "learning_rate": float(self._adam.learning_rate),
            "beta1": float(self._adam.beta1),
            "beta2": float(self._adam.beta2),
            "eps": float(self._adam.eps),
            "weight_decay": float(self._adam.weight_decay),
            "grad_clip_norm": float(self._adam.grad_clip_norm),
        }


CREATE_TIMEOUT_S = 300.0
"""How long `.result()` waits for the service to create a training client when the caller gives
no timeout (`LOSSLAB_TINKER_TIMEOUT_S` overrides it). Measured with SDK 0.38 against a closed
loopback port: the SDK's own `create_lora_training_client` call blocks for about 300 s of
connection retries before it raises `APIConnectionError`, so losslab probes the URL first and runs
that call in a worker thread, bounding (and polling, for Ctrl-C) the wait itself."""

TIMEOUT_ENV = "LOSSLAB_TINKER_TIMEOUT_S"
PROBE_TIMEOUT_S = 5.0
"""A TCP connection to the service's host that takes longer than this counts as unreachable."""
POLL_S = 0.2
"""Waits on the service wake up this often, so Ctrl-C and SIGTERM act within a second."""
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def service_url(base_url: str | None = None) -> str:
    """The URL the SDK will use: `base_url`, else $TINKER_BASE_URL, else the SDK's default."""
    from tinker.lib.base_url import resolve_base_url

    return resolve_base_url(base_url)


def check_hint(url: str) -> str:
    return f"check TINKER_BASE_URL and the network, e.g. `curl -sS {url}` should answer"


def probe_service(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast, naming the URL, when the service's host cannot be reached over TCP.

    Skipped behind a proxy (the SDK's HTTP client would go through it, a direct connect not).

    Raises:
        ConnectionError: the host name does not resolve, or the connection is refused or
            times out.
    """
    if any(os.environ.get(k) for k in _PROXY_ENV):
        return
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise ConnectionError(f"the Tinker base URL {url!r} has no host; {check_hint(url)}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConnectionError(f"the Tinker base URL {url!r} has a bad port") from None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConnectionError(
            f"cannot reach the Tinker service at {url} ({host}:{port}: {why}); {check_hint(url)}"
        ) from None


def wait_interruptibly(future: concurrent.futures.Future, timeout_s: float) -> Any:
    """`future.result()`, waiting in slices of `POLL_S` so a signal's exception (Ctrl-C,
    SIGTERM) is raised within a second; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout_s:g} s")
        try:
            return future.result(min(POLL_S, left))
        except concurrent.futures.TimeoutError:
            continue


CALL_TIMEOUT_S = 1800.0
"""Longest wait for one training call (forward_backward, optim_step, save/load state) when the
caller gives no timeout; `LOSSLAB_TINKER_CALL_TIMEOUT_S` overrides it. Generous: a busy service
queues requests; bounded: a lost connection must end the run with a message, not hang it."""
CALL_TIMEOUT_ENV = "LOSSLAB_TINKER_CALL_TIMEOUT_S"
_BOUNDED_SDK_CALLS = frozenset(
    {
        "save_state",
        "load_state",
        "load_state_with_optimizer",
        "save_weights_for_sampler",
        "save_weights_and_get_sampling_client",
    }
)


_BOUNDED_SAMPLING_CALLS = frozenset({"sample", "compute_logprobs"})
"""Sampling-client calls whose futures are bounded like training calls (issue 25: a sampling
request the service never answered hung the run)."""
_SAMPLING_CLIENT_CALLS = frozenset({"save_weights_and_get_sampling_client"})


class TinkerSamplingClient:
    """Wraps a `tinker.SamplingClient`: `sample` and `compute_logprobs` return `BoundedFuture`s
    (interruptible within a second, at most the call timeout); the rest passes through."""

    def __init__(self, sdk_client: Any, url: str = "", call_timeout_s: float | None = None):
        self._sdk, self._url, self._call_timeout_s = sdk_client, url, call_timeout_s

    def __repr__(self) -> str:
        return f"TinkerSamplingClient({type(self._sdk).__name__})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = getattr(self._sdk, name)
        if name in _BOUNDED_SAMPLING_CALLS:
            return lambda *a, **k: BoundedFuture(
                attr(*a, **k), name, self._url, self._call_timeout_s
            )
        return attr


class BoundedFuture:
    """An SDK future whose `result()` waits in `POLL_S` slices (Ctrl-C/SIGTERM act within a
    second) and at most the call timeout, then raises a TimeoutError naming the call and URL.
    `wrap` is applied to the value (a sampling client gets its calls bounded too)."""

    def __init__(
        self,
        future: Any,
        what: str,
        url: str,
        timeout_s: float | None,
        wrap: Callable[[Any], Any] | None = None,
    ) -> None:
        self._future, self._what, self._url = future, what, url
        self._timeout_s = timeout_s
        self._wrap = wrap

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._future, name)

    def result(self, timeout: float | None = None) -> Any:
        wait_s = (
            timeout
            if timeout is not None
            else _env_seconds(CALL_TIMEOUT_ENV, self._timeout_s, CALL_TIMEOUT_S)
        )
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                where = f" at {self._url}" if self._url else ""
                raise TimeoutError(
                    f"the Tinker service{where} did not answer {self._what} within {wait_s:g} s; "
                    f"{check_hint(self._url or 'TINKER_BASE_URL')}"
                )
            try:
                value = self._future.result(min(POLL_S, left))
            except TimeoutError:  # concurrent.futures.TimeoutError is TimeoutError (3.11)
                continue
            return self._wrap(value) if self._wrap is not None else value

    async def result_async(self, timeout: float | None = None) -> Any:
        value = await self._future.result_async(timeout)
        return self._wrap(value) if self._wrap is not None else value

    def __await__(self):
        return self._future.__await__()


def _in_thread(fn: Callable[[], Any]) -> concurrent.futures.Future:
    """Run a blocking SDK call in a daemon thread (an abandoned one cannot keep the process)."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def work() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to the waiting thread
            future.set_exception(e)

    threading.Thread(target=work, daemon=True, name="losslab-tinker-wait").start()
    return future


class _TrainingClientFuture:
    """Future of a TinkerTrainingClient: the SDK's (blocking) client creation, then its future,
    waited on interruptibly and within one timeout that names the service."""

    def __init__(
        self,
        submit: concurrent.futures.Future,
        adam_params: types.AdamParams | None,
        default_timeout_s: float,
        url: str = "",
    ) -> None:
        self._submit = submit  # resolves to the SDK's client-creation future
        self._adam = adam_params
        self._default_timeout_s = default_timeout_s
        self._url = url

    def result(self, timeout: float | None = None) -> TinkerTrainingClient:
        import time

        wait_s = self._default_timeout_s if timeout is None else timeout
        t0 = time.monotonic()
        try:
            sdk_future = wait_interruptibly(self._submit, wait_s)
            left = max(wait_s - (time.monotonic() - t0), 0.0)
            sdk_client = wait_interruptibly(_in_thread(lambda: sdk_future.result(left)), left)
        except TimeoutError as e:
            where = f" at {self._url}" if self._url else ""
            raise TimeoutError(
                f"the Tinker service{where} created no training client within {wait_s:g} s "
                f"(unreachable, or busy); {check_hint(self._url or 'TINKER_BASE_URL')}"
            ) from e
        return TinkerTrainingClient(sdk_client, self._adam, url=self._url)

    async def result_async(self, timeout: float | None = None) -> TinkerTrainingClient:
        import asyncio

        sdk_future = await asyncio.wrap_future(self._submit)
        return TinkerTrainingClient(await sdk_future, self._adam, url=self._url)

    def __await__(self):
        return self.result_async().__await__()


def _env_seconds(env: str, given: float | None, default: float) -> float:
    """`given`, else the environment variable `env` (seconds > 0), else `default`."""
    if given is not None:
        return float(given)
    raw = os.environ.get(env)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{env}={raw!r} is not a number of seconds") from None
        if not value > 0:
            raise ValueError(f"{env}={raw!r} must be > 0")
        return value
    return default


class TinkerServiceClient:
    """`tinker.ServiceClient` with the key from TINKER_API_KEY only.

    Args:
        sdk_client: an already-built SDK ServiceClient (tests pass a fake); default builds one.
        create_timeout_s: how long creating a training client may take before a TimeoutError
            that names the service (the SDK alone blocks ~300 s on an unreachable URL).
        **sdk_kwargs: forwarded to `tinker.ServiceClient` (base_url, project_id, ...); an
            `api_key` argument is refused so the key cannot come from code or config files.
    """

    def __init__(
        self,
        *,
        sdk_client: Any = None,
        create_timeout_s: float | None = None,
        **sdk_kwargs: Any,
    ) -> None:
        if "api_key" in sdk_kwargs:
            raise ValueError(f"api_key is not accepted; set the {API_KEY_ENV} environment variable")
        self._url = ""
        if sdk_client is None:
            import tinker

            key = api_key_from_env()
            self._url = service_url(sdk_kwargs.get("base_url"))
            probe_service(self._url)  # an unreachable URL fails here, in seconds, by name
            sdk_client = tinker.ServiceClient(api_key=key, **sdk_kwargs)
        self._sdk = sdk_client
        self._create_timeout_s = _env_seconds(TIMEOUT_ENV, create_timeout_s, CREATE_TIMEOUT_S)

    def __repr__(self) -> str:
        return "TinkerServiceClient(api_key=<from TINKER_API_KEY, hidden>)"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._sdk, name)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        *,
        adam_params: types.AdamParams | None = None,
        **kwargs: Any,
    ) -> _TrainingClientFuture:
        # the SDK call itself blocks while it opens a session: run it where a wait can end
        submit = _in_thread(
            lambda: self._sdk.create_lora_training_client(
                base_model, rank=rank, seed=seed, **kwargs
            )
        )
        return _TrainingClientFuture(submit, adam_params, self._create_timeout_s, self._url)

    def create_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        return TinkerSamplingClient(self._sdk.create_sampling_client(*args, **kwargs), self._url)


NAME = "tinker"


class TinkerBackend:
    """The Tinker service (`TinkerServiceClient`); checkpoints are server-side states named
    after the run, the arm and the step, referenced by the path the service returns."""

    name = NAME
    executes_local_base_model = False

    def create_service_client(self, **kwargs: Any) -> TinkerServiceClient:
        return TinkerServiceClient(**kwargs)

    def device(self) -> str:
        return "Tinker service"

    def gpus(self) -> float:
        return 0.0  # the service's GPUs are not this process's; GPU-hours come from the plan

    def save_checkpoint(self, client: Any, folder: Path, name: str) -> dict[str, Any]:
        return {"backend": NAME, "path": str(client.save_state(name).result().path)}

    def load_checkpoint(self, client: Any, folder: Path, info: dict[str, Any]) -> None:
        # weights AND AdamW moments: Tinker's plain load_state restores the weights only
        client.load_state_with_optimizer(str(info["path"])).result()


BACKEND = TinkerBackend()

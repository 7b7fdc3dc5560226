"""Futures with the Tinker SDK's shape: `.result(timeout=None)`, `await fut`, `result_async()`,
`.future()` and `.coroutine()` (`tinker.APIFuture`).

The local backend runs training operations eagerly (so submission order is execution order, the
Tinker sequencing rule) and wraps the value in a completed future. Sampling returns a *lazy*
future: the work runs when any pending result is first requested, so that several requests can be
coalesced into one batched generation (see `local.sampling`).

Coalescing under asyncio. Code that awaits each request right after submitting it (the
cookbook's rollouts: `asyncio.gather` over envs, each doing `await client.sample(...)`) would
flush one request at a time. So an *awaited* lazy future first yields to the event loop until
one whole pass of the loop queues no new request on its client (`queued`), then flushes: every
request submitted in that tick runs in one batched generation, as when a caller submits all
before reading any. `.result()` (blocking) flushes at once.

Client futures. `create_*_client` return a `ClientFuture`: a future of the client that also
acts as the client (attribute access is forwarded to the resolved client with the SDK's
FutureWarning), as the SDK's `BackcompatTrainingClientFuture` / `BackcompatSamplingClientFuture`
do, so code written for the older SDK that skips `.result()` keeps working.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import warnings
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C")


MAX_COALESCE_PASSES = 1000
"""Bound on the event-loop passes an awaited request waits for others (progress guarantee
against a producer that queues a new request on every pass)."""


async def _until_quiet(queued: Callable[[], int]) -> None:
    """Yield to the event loop until a full pass of it queues no new request."""
    for _ in range(MAX_COALESCE_PASSES):
        before = queued()
        await asyncio.sleep(0)
        if queued() == before:
            return


class LazyFuture(Generic[T]):
    """A future resolved by calling `flush()` (which must call `set_result`/`set_error`).

    `queued`, when given, counts the requests ever queued on the flushing client; awaiting the
    future waits for that count to settle within one event-loop pass before flushing.
    """

    def __init__(self, flush: Callable[[], None], queued: Callable[[], int] | None = None) -> None:
        self._flush = flush
        self._queued = queued
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def set_result(self, value: T) -> None:
        self._value, self._done = value, True

    def set_error(self, error: BaseException) -> None:
        self._error, self._done = error, True

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> T:
        if not self._done:
            self._flush()
        if not self._done:
            raise RuntimeError("internal error: the sampling batch finished without this result")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    async def result_async(self, timeout: float | None = None) -> T:
        if not self._done and self._queued is not None:
            await _until_quiet(self._queued)
        return self.result(timeout)

    async def coroutine(self) -> T:
        """This future as a coroutine (`tinker.APIFuture.coroutine`), for APIs that need one,
        such as `asyncio.create_task`."""
        return await self

    def __await__(self) -> Generator[Any, None, T]:
        return self.result_async().__await__()

    def future(self) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            fut.set_result(self.result())
        except Exception as exc:  # the concurrent future carries the error to its reader
            fut.set_exception(exc)
        return fut


class CompletedFuture(LazyFuture[T]):
    """A future whose value (or exception) is already known; mirrors `tinker.APIFuture`."""

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        super().__init__(flush=lambda: None)
        if error is not None:
            self.set_error(error)
        else:
            self._value, self._done = value, True


class ClientFuture(CompletedFuture[C]):
    """A completed future of a client that can also be used, deprecated, as the client.

    Mirrors the SDK's `BackcompatClientFuture`: `result()`/`await` give the client; any other
    public attribute is read from the client with the SDK's FutureWarning, so
    `service.create_lora_training_client(...).forward_backward(...)` works as on Tinker.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        warnings.warn(
            f"Reading `.{name}` from the future returned by a client-creation method is "
            "deprecated in the tinker SDK (and works locally for the same compatibility). "
            "Call .result() on the future, or await it, to get the client first.",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self.result(), name)

    def __repr__(self) -> str:
        state = f"failed: {self._error!r}" if self._error is not None else repr(self._value)
        return f"<ClientFuture: {state}>"


def client_future(fn: Callable[[], C]) -> ClientFuture[C]:
    """Create a client now (errors raise here, see `run_eagerly`) and return its future."""
    return ClientFuture(fn())


def run_eagerly(fn: Callable[[], T]) -> CompletedFuture[T]:
    """Run `fn` now and wrap its value. Errors raise at the call site, not at `.result()`: a
    local caller then sees bad input where it was passed, and no later request runs on a
    half-applied state (the SDK instead poisons the client)."""
    return CompletedFuture(fn())

"""Futures with the Tinker SDK's shape: `.result(timeout=None)`, `await fut`, `result_async()`.

The local backend runs training operations eagerly (so submission order is execution order, the
Tinker sequencing rule) and wraps the value in a completed future. Sampling returns a *lazy*
future: the work runs when any pending result is first requested, so that several requests can be
coalesced into one batched generation (see `local.sampling`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LazyFuture(Generic[T]):
    """A future resolved by calling `flush()` (which must call `set_result`/`set_error`)."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
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
        return self.result(timeout)

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


def run_eagerly(fn: Callable[[], T]) -> CompletedFuture[T]:
    """Run `fn` now and wrap its value. Errors raise at the call site, not at `.result()`: a
    local caller then sees bad input where it was passed, and no later request runs on a
    half-applied state (the SDK instead poisons the client)."""
    return CompletedFuture(fn())

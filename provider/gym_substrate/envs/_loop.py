"""The one sync/async bridge of a `SandboxEnv`: a private event loop on a background thread.

Gymnasium is synchronous and the provider is asyncio (its gRPC channel and HTTP pool are bound to
the loop that created them), so each env owns exactly one loop, started lazily on first use and
driven with `run_coroutine_threadsafe`. `asyncio.run` per step would build and tear down a loop
(and with it the provider's channel) on every call. Lazy start matters for vector envs: an env
built in a parent process and then forked or pickled into a worker must not carry a thread that
does not exist there, so the loop is (re)created in whichever process first uses it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "LoopThreadClosedError"]

T = TypeVar("T")


class LoopThreadClosedError(RuntimeError):
    """The bridge was closed; nothing more can be submitted to it."""


class LoopThread:
    """A lazily started event loop running forever on a daemon thread."""

    def __init__(self, name: str = "gym-substrate-env-loop") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        """True when a loop is running in this process."""
        return self._loop is not None and self._pid == os.getpid()

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise LoopThreadClosedError("the env's event loop is closed")
            if self._loop is not None and self._pid == os.getpid():
                return self._loop
            # First use, or first use after a fork: the parent's thread does not exist here, so
            # its loop cannot be driven; drop it (without closing: its state is the parent's).
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def _serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=_serve, name=self._name, daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread, self._pid = loop, thread, os.getpid()
            return loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (re-raising its exception).

        On `timeout` the coroutine is cancelled and `TimeoutError` raised.
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own loop thread (would deadlock)")
        try:
            loop = self._ensure_loop()
        except BaseException:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"gave up waiting after {timeout} s") from None
        except BaseException:
            # KeyboardInterrupt while waiting: do not leave the coroutine running unobserved.
            future.cancel()
            raise

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is still running, stop the loop and join the thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread, pid = self._loop, self._thread, self._pid
            self._loop = self._thread = None
        if loop is None or thread is None or pid != os.getpid():
            return
        if threading.current_thread() is thread:  # closing from inside: just stop
            loop.call_soon(loop.stop)
            return

        async def _drain() -> None:
            current = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not current]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await loop.shutdown_asyncgens()

        try:
            asyncio.run_coroutine_threadsafe(_drain(), loop).result(timeout)
        except Exception:  # best effort: still stop the loop below
            pass
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()

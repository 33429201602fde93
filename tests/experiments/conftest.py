"""Fixtures for the experiments' tests: one local backend shared by the whole module set.

Starting a backend costs seconds on a busy machine, so most commands run against one backend
(process runtime, 2 workers) served from a background thread, through `--config FILE` exactly as
they would against a cluster. The few tests that need the local-only host figures (footprint,
burst) or gVisor start their own. Each test uses its own atespace, so a leak in one never shows
up in another's counts.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

_ATESPACES = itertools.count()


class ThreadBackend:
    """A local backend running on its own event loop in a daemon thread."""

    def __init__(self, runtime: str = "process", workers: int = 2) -> None:
        self.runtime, self.workers = runtime, workers
        self.loop = asyncio.new_event_loop()
        self.kwargs: dict[str, Any] = {}
        self._stop = asyncio.Event()
        self._up = threading.Event()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._serving = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        if not self._up.wait(timeout=120):
            raise RuntimeError("the shared local backend did not start within 120 s")
        if self._serving.done():
            self._serving.result()  # raises why it failed

    async def _serve(self) -> None:
        try:
            from gym_substrate.lab.experiments.backend import local_or_config

            # the experiments' own start: 2 workers x 1 actor, ready once its golden snapshot is
            async with local_or_config(None, self.runtime, self.workers) as target:
                self.kwargs = target.provider_kwargs
                self._up.set()
                await self._stop.wait()
        finally:
            self._up.set()

    def stop(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._serving.result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)

    def config(self, path: Path, atespace: str | None = None) -> Path:
        """A Gym provider YAML for this backend, with its own atespace."""
        block = {k: dict(v) if isinstance(v, dict) else v for k, v in self.kwargs.items()}
        block["connection"] = {
            **block["connection"],
            "atespace": atespace or f"t{next(_ATESPACES)}",
        }
        path.write_text(yaml.safe_dump({"sandbox": {"substrate": block}}))
        return path


@pytest.fixture(scope="session")
def shared_backend() -> Iterator[ThreadBackend]:
    backend = ThreadBackend()
    backend.start()
    yield backend
    backend.stop()


@pytest.fixture
def config(shared_backend: ThreadBackend, tmp_path: Path) -> Path:
    """A provider config file for the shared backend, in a fresh atespace."""
    return shared_backend.config(tmp_path / "provider.yaml")

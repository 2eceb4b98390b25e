"""A small synchronous facade: the asyncio Client driven by an event loop
on a private thread. Every method of the asyncio Client that is a
coroutine is available here as a blocking call with the same arguments
(``acquire``, ``renew``, ``release``, ``get``, ``list``, ``validate``,
``create_session``, ``session_heartbeat``, ``keys``, ...).

    with leasehold.sync.Client("127.0.0.1:7700") as c:
        lease = c.acquire("camera/7", "worker-1", ttl=10)
        c.release(lease.lease_id, lease.token)

For keep-alives, sessions, events and recipes use the asyncio API."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Coroutine, Optional, TypeVar

from . import client as _client

T = TypeVar("T")


class Client:
    def __init__(self, *args: Any, **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leasehold-sync", daemon=True)
        self._thread.start()
        self._c: Optional[_client.Client] = None
        self._c = self._run(self._make(*args, **kw))

    @staticmethod
    async def _make(*args: Any, **kw: Any) -> _client.Client:
        return _client.Client(*args, **kw)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        c = self.__dict__.get("_c")
        if c is None or name.startswith("_") or name in ("events", "session", "keep_alive"):
            raise AttributeError(name)
        fn = getattr(c, name)
        if not asyncio.iscoroutinefunction(fn):
            raise AttributeError(name)

        def call(*args: Any, **kw: Any) -> Any:
            return self._run(fn(*args, **kw))
        call.__doc__ = fn.__doc__
        return call

    def close(self) -> None:
        if self._c is not None:
            self._run(self._c.close())
            self._c = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

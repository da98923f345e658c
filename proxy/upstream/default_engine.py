"""A server's default engine, or why there is none yet: the one object everything that needs it reads.

`tapdeck serve --engine URL` is normally started beside its engine, and vLLM answers nothing while it
loads a large model (minutes). So a server whose engine does not answer yet starts anyway and
*awaits* it: its address is asked again every `RETRY_PAUSE_S` on a thread of its own until it
settles as any engine address does (proxy/upstream/address.py) and lists the model asked for, or
until the wait's limit (`ServerConfig.engine_wait_s`) passes. Meanwhile whatever needs it (a session
or a run on the default engine) is refused with a 503 and Retry-After (`EngineLoading`), and
`/health` says what is awaited. Only a failure a starting engine shows is waited out
(`address.not_up_yet`); an address that answers as no engine does is refused at once.

The capture service, its session registry, the runner's routes and `app/host.py`'s LocalServer hold
the same `DefaultEngine`, so all of them see the engine the moment it answers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from tapdeck.proxy.errors import ProxyError
from tapdeck.proxy.upstream.address import EngineAddressError, EngineNotUpYet, settle_blocking, shown_url
from tapdeck.proxy.upstream.tiers import EngineSpec
from tapdeck.schema.sessions import EngineWait

RETRY_PAUSE_S = 1.0
"""Between two tries: a refused connect costs nothing, and a session waits no longer than this
after the engine is up."""
RETRY_AFTER_S = 10
"""The Retry-After sent with the 503 of a request that needs the engine meanwhile."""

log = logging.getLogger("tapdeck.proxy")


class EngineLoading(ProxyError):
    """A request that needs the default engine while the server still waits for it (503)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, kind="engine_loading", retryable=True, retry_after=RETRY_AFTER_S)


class DefaultEngine:
    """The default engine of one server: none, ready (`spec`), awaited, or given up on."""

    def __init__(self, spec: EngineSpec | None = None) -> None:
        """A default engine known now (`spec`), or none (None)."""
        self._spec = spec
        self._awaited: EngineSpec | None = None
        """The engine as given (its address not settled then) when it was awaited; None for one
        known from the start."""
        self._failure: EngineAddressError | None = None
        self._limit_s = 0.0
        self._since = 0.0
        self._ended: float | None = None
        """When the wait ended (the engine answered or was given up on)."""
        self._clock: Callable[[], float] = time.monotonic
        self._pause_s = RETRY_PAUSE_S
        self._over = threading.Event()
        """Set once the wait is over: the engine answered, or it was given up on."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._over.set()

    @classmethod
    def of(cls, value: DefaultEngine | EngineSpec | None) -> DefaultEngine:
        """`value` itself, or a default engine ready with that spec (None: no default engine)."""
        return value if isinstance(value, DefaultEngine) else cls(value)

    @classmethod
    def awaiting(
        cls,
        engine: EngineSpec,
        *,
        limit_s: float,
        pause_s: float = RETRY_PAUSE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> DefaultEngine:
        """A default engine at `engine.url` (any address form), `engine.model` checked against its
        listing. Nothing is asked yet: `try_now()` asks once, `keep_trying()` until it answers."""
        self = cls()
        self._awaited = engine
        self._limit_s = limit_s
        self._pause_s = pause_s
        self._clock = clock
        self._since = clock()
        self._over.clear()
        return self

    # ------------------------------------------------------------------ reading it

    @property
    def spec(self) -> EngineSpec | None:
        """The engine, once it answered (None while awaited, or when there is none)."""
        return self._spec

    def get(self) -> EngineSpec | None:
        """The engine for a request that needs it (None: this server has no default engine).
        Raises EngineLoading while it is awaited, and the refusal that ended the wait after."""
        if self._spec is not None or self._awaited is None:
            return self._spec
        if self._failure is not None:
            raise self._failure
        wait = self.waiting()
        assert wait is not None  # awaited, neither answered nor given up on
        raise EngineLoading(
            f"this server's default engine does not answer yet: {wait.line()} of "
            f"{wait.limit_s:.0f} s (vLLM answers once its weights are loaded); retry in "
            f"{RETRY_AFTER_S} s, or name another engine"
        )

    def waiting(self) -> EngineWait | None:
        """What `/health` says while the engine is awaited; None otherwise."""
        awaited = self._awaited
        if awaited is None or self._over.is_set():
            return None
        return EngineWait(url=shown_url(awaited.url), waited_s=self.waited_s, limit_s=self._limit_s)

    @property
    def waited_s(self) -> float:
        """Seconds the engine has been awaited, or was until it answered (0: never awaited)."""
        if self._awaited is None:
            return 0.0
        return (self._ended if self._ended is not None else self._clock()) - self._since

    @property
    def failure(self) -> EngineAddressError | None:
        """Why the wait ended without an engine (None while it goes on, or once the engine answered)."""
        return self._failure

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the wait is over (the engine answered or was given up on), at most
        `timeout` seconds; whether it is over."""
        return self._over.wait(timeout)

    # ------------------------------------------------------------------ awaiting it

    def try_now(self) -> bool:
        """Ask the awaited engine once: True once it answered (also when it had before). Raises
        EngineAddressError when it answered as no engine does, does not serve the model asked
        for, or the wait's limit has passed; False while it may still come up."""
        awaited = self._awaited
        if self._spec is not None or awaited is None:
            return True
        if self._failure is not None:
            raise self._failure
        try:
            settled = settle_blocking(awaited.url, api_key=awaited.api_key)
            settled.require_model(awaited.model)
        except EngineNotUpYet as exc:
            waited = self.waited_s
            if waited < self._limit_s:
                return False
            self._give_up(
                EngineAddressError(f"{exc.message} (waited {waited:.0f} s; --engine-wait)", exc.status)
            )
        except EngineAddressError as exc:
            self._give_up(exc)
        self._ended = self._clock()
        self._spec = awaited.model_copy(update={"url": settled.base_url})
        self._over.set()
        return True

    def _give_up(self, error: EngineAddressError) -> NoReturn:
        self._ended = self._clock()
        self._failure = error
        self._over.set()
        raise error

    def keep_trying(self) -> None:
        """Ask again every `pause_s` on a thread until the engine answers or is given up on."""
        if self._over.is_set() or self._thread is not None:
            return
        assert self._awaited is not None
        log.info("waiting for the engine at %s", shown_url(self._awaited.url))
        self._thread = threading.Thread(target=self._keep_trying, name="tapdeck-engine-wait", daemon=True)
        self._thread.start()

    def _keep_trying(self) -> None:
        # The last try falls on the limit, so that the wait ends when it says it does.
        while not self._stop.wait(min(self._pause_s, max(0.0, self._limit_s - self.waited_s))):
            try:
                if self.try_now():
                    answered = shown_url(self._spec.url if self._spec else "")
                    log.info("the engine at %s answered after %.0f s", answered, self.waited_s)
                    return
            except EngineAddressError as exc:
                log.error("%s", exc)
                return
            except Exception as exc:  # a wait must end, never hang on a dead thread
                log.exception("waiting for the engine failed")
                with contextlib.suppress(EngineAddressError):
                    self._give_up(EngineAddressError(f"waiting for the engine failed: {exc}", 502))
                return

    def close(self) -> None:
        """Stop asking (a server stopping while it waits); a try under way is left to end."""
        self._stop.set()


__all__ = ["DefaultEngine", "EngineLoading"]

"""Which policy version an engine serves, read around each model call (the rule is in docs/capture.md).

In asynchronous RL a trainer pushes new weights into the engine while agents are mid-rollout, so
each turn is stamped with the version that sampled it, from the first source that says:

1. **The reply**: SGLang's OpenAI server writes `metadata.weight_version` into each reply (its
   native `/generate` writes `meta_info.weight_version`).
2. **The engine's weight-info route**, read before and after the call: vLLM's
   `GET /weight_info` at the server root answers `{"weight_version": <str or null>}`. Each engine
   is probed for it once; an engine without it is remembered as such and costs nothing per call.
3. **The trainer**: the latest version posted to `POST /admin/engines/version` for the engine
   (or for every engine), read before and after the call.

A call whose before and after readings differ straddled a weight update: it is stamped with both,
never silently with one of them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tapdeck.proxy.capture.policy_stamp import PolicyStamp, policy_version
from tapdeck.proxy.upstream.client import EngineClient, EngineError
from tapdeck.schema.sessions import EngineVersion, EngineVersions, PolicySource, PolicyVersion, engine_root

WEIGHT_INFO_PATH = "/weight_info"
"""vLLM's route (at the server root, beside `/v1`), served in its dev mode
(`VLLM_SERVER_DEV_MODE=1`, as the RL weight-transfer routes are)."""


def reply_version(reply: dict[str, Any]) -> PolicyVersion | None:
    """The version an engine wrote into its reply (SGLang), or None."""
    for key in ("metadata", "meta_info"):
        holder = reply.get(key)
        if isinstance(holder, dict) and (version := policy_version(holder.get("weight_version"))) is not None:
            return version
    return None


class PolicyVersions:
    """One server's knowledge of its engines' policy versions: what trainers posted, which engines
    have a weight-info route, and the latest version each engine reported."""

    def __init__(self) -> None:
        self._posted: dict[str | None, tuple[PolicyVersion, float]] = {}
        """Engine root (None: every engine) → the version a trainer posted last, and when."""
        self._routes: dict[str, asyncio.Future[bool]] = {}
        """Engine root → whether it answers the weight-info route (probed once)."""
        self._in_reply: set[str] = set()
        """Engine roots whose replies carry their version: no route is read for them."""
        self._seen: dict[str, tuple[PolicyVersion, PolicySource, float]] = {}
        """Engine root → the version it reported last (reply or route), its source, and when."""

    def post(self, version: PolicyVersion, engine: str | None = None) -> EngineVersions:
        """A trainer's word: `engine` (every engine when None) serves `version` from now on."""
        self._posted[engine_root(engine) if engine else None] = (version, time.time())
        return self.listing()

    def listing(self) -> EngineVersions:
        """Every engine's current version as known here: reported by the engine, else posted."""
        rows: dict[str | None, EngineVersion] = {
            root: EngineVersion(engine=root, version=version, source="trainer", at=at)
            for root, (version, at) in self._posted.items()
        }
        for root, (version, source, at) in self._seen.items():
            rows[root] = EngineVersion(engine=root, version=version, source=source, at=at)
        return EngineVersions(engines=sorted(rows.values(), key=lambda e: (e.engine is not None, e.engine)))

    def _trainer(self, root: str) -> PolicyVersion | None:
        posted = self._posted.get(root) or self._posted.get(None)
        return None if posted is None else posted[0]

    def forget(self, url: str) -> None:
        """Probe this engine's route again on its next call (it restarted, maybe another build)."""
        root = engine_root(url)
        self._routes.pop(root, None)
        self._in_reply.discard(root)

    async def watch(self, client: EngineClient) -> CallWatch:
        """The readings before one call to `client`'s engine (probing its route the first time)."""
        root = engine_root(client.url)
        route = None
        if root not in self._in_reply and await self._has_route(client, root):
            route = await _read_route(client, root)
        return CallWatch(self, client, root, route, self._trainer(root))

    async def _has_route(self, client: EngineClient, root: str) -> bool:
        known = self._routes.get(root)
        if known is None:  # the first call probes; calls arriving meanwhile wait for its answer
            known = self._routes[root] = asyncio.get_running_loop().create_future()
            try:
                reply = await client.get(root + WEIGHT_INFO_PATH)
                known.set_result(isinstance(reply, dict) and "weight_version" in reply)
            except EngineError:
                known.set_result(False)
            except BaseException:
                del self._routes[root]
                known.cancel()
                raise
        return await asyncio.shield(known)

    def _saw(self, root: str, version: PolicyVersion | None, source: PolicySource) -> None:
        if version is not None:
            self._seen[root] = (version, source, time.time())


class CallWatch:
    """One call's readings: taken before it by `PolicyVersions.watch`, finished by `stamp`."""

    __slots__ = ("_client", "_route", "_trainer", "_versions", "root")

    def __init__(
        self,
        versions: PolicyVersions,
        client: EngineClient,
        root: str,
        route: _RouteReading | None,
        trainer: PolicyVersion | None,
    ) -> None:
        self._versions = versions
        self._client = client
        self.root = root
        self._route = route
        self._trainer = trainer

    async def stamp(self, reply: dict[str, Any]) -> PolicyStamp | None:
        """The call's stamp from its reply and the readings after it (None: no source says)."""
        versions = self._versions
        version = reply_version(reply)
        if version is not None:
            versions._in_reply.add(self.root)
            versions._saw(self.root, version, "reply")
            return PolicyStamp("reply", version, version)
        if self._route is not None and self._route.ok:
            after = await _read_route(self._client, self.root)
            if after.ok and (self._route.version is not None or after.version is not None):
                versions._saw(self.root, after.version, "weight_info")
                return PolicyStamp("weight_info", self._route.version, after.version)
        after_trainer = versions._trainer(self.root)
        if self._trainer is None and after_trainer is None:
            return None
        return PolicyStamp("trainer", self._trainer, after_trainer)


class _RouteReading:
    __slots__ = ("ok", "version")

    def __init__(self, ok: bool, version: PolicyVersion | None) -> None:
        self.ok = ok
        """False when the read failed: this call then takes its version from the trainer."""
        self.version = version


async def _read_route(client: EngineClient, root: str) -> _RouteReading:
    try:
        reply = await client.get(root + WEIGHT_INFO_PATH)
    except EngineError:
        return _RouteReading(False, None)
    if not isinstance(reply, dict):
        return _RouteReading(False, None)
    return _RouteReading(True, policy_version(reply.get("weight_version")))


__all__ = ["WEIGHT_INFO_PATH", "CallWatch", "PolicyVersions", "reply_version"]

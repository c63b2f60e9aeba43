"""A lean asynchronous client of the Kubernetes API for the bridge: raw JSON in and out.

kubernetes-asyncio reads the kubeconfig or the in-cluster service account (`load`: its
`Configuration` carries the server, the CA, a client certificate or a bearer token, and the
hooks that refresh an expiring token); requests then go through one aiohttp session as plain
JSON, decoded with orjson, not through the generated models, whose deserialisation of a list
of 100,000 pods costs seconds.

Every request but a watch passes a client-side rate limit (`RateLimit`: `qps` requests a
second on average, bursts of up to `burst`, as client-go's token bucket) and a bound on the
requests in flight (`concurrency`), so that a burst of 10,000 bindings is many requests at
once within the limits, not 10,000 serial round trips and not 10,000 sockets. A failed call
raises `KubeError` with the API's status code, reason and message. `watch` yields the watch
events of a path as dicts, bookmarks included; a 410 Gone arrives as `KubeError(410)` (as an
ERROR event or as the answer to the watch request), for the caller to relist, and a
connection refused or dropped as `KubeError(0)`, for the caller to watch again.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """An API call that failed: `status` (HTTP code, 0 when the server was not reached),
    `reason` (the Status object's reason, e.g. NotFound, Conflict, TooManyRequests) and the
    server's message."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}".strip())
        self.status, self.reason, self.message = status, reason, message


class RateLimit:
    """A token bucket: `qps` tokens a second, at most `burst` saved up (client-go's
    `--kube-api-qps` / `--kube-api-burst`). `qps` 0: no limit."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self.clock = qps, max(1, burst), clock
        self.tokens = float(self.burst)
        self.last = clock()
        self._lock = asyncio.Lock()

    def delay(self) -> float:
        """Take a token; how long to wait before using it."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
        self.last = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:
            wait = self.delay()
        if wait > 0:
            await asyncio.sleep(wait)


@dataclass(frozen=True)
class Limits:
    qps: float = 200.0
    burst: int = 400
    concurrency: int = 64
    timeout_s: float = 30.0


async def load(kubeconfig: str = "", context: str = "") -> Configuration:
    """The client configuration: the kubeconfig file (or `$KUBECONFIG`, `~/.kube/config`), or
    the pod's service account when `kubeconfig` is "in-cluster"."""
    configuration = Configuration()
    if kubeconfig == "in-cluster":
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await kube_config.load_kube_config(config_file=kubeconfig or None, context=context or None,
                                           client_configuration=configuration)
    return configuration


def ssl_context(configuration: Configuration) -> ssl.SSLContext | bool:
    if not configuration.verify_ssl:
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    return context


class KubeApi:
    """See the module docstring. Use as an async context manager, or `close()`."""

    def __init__(self, configuration: Configuration, limits: Limits | None = None) -> None:
        self.configuration = configuration
        self.server = str(configuration.host).rstrip("/")
        self.limits = limits = limits or Limits()
        self.rate = RateLimit(limits.qps, limits.burst)
        self._slots = asyncio.Semaphore(max(1, limits.concurrency))
        self._session: aiohttp.ClientSession | None = None
        self.requests: Counter[tuple[str, int]] = Counter()  # (verb, status) -> count

    @classmethod
    async def connect(cls, kubeconfig: str = "", context: str = "", limits: Limits | None = None) -> KubeApi:
        return cls(await load(kubeconfig, context), limits)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=ssl_context(self.configuration),
                                             limit=max(1, self.limits.concurrency) + 16)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: orjson.dumps(o).decode())
        return self._session

    async def headers(self, content_type: str = JSON) -> dict[str, str]:
        out = {"Accept": JSON, "Content-Type": content_type, "User-Agent": "koordstream-bridge"}
        auth = await self.configuration.auth_settings()
        for setting in auth.values():
            if setting.get("in") == "header" and setting.get("value"):
                out[setting["key"]] = setting["value"]
        return out

    async def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = JSON, timeout_s: float | None = None,
                      limited: bool = True) -> Any:
        """One call, within the rate limit and the concurrency bound (`limited`: the leader
        election's calls are not, or they would wait behind a burst of writes for longer than
        the Lease lasts); the decoded answer."""
        if not limited:
            return await self._call(method, path, params, body, content_type, timeout_s)
        await self.rate.acquire()
        async with self._slots:
            return await self._call(method, path, params, body, content_type, timeout_s)

    async def _call(self, method: str, path: str, params: Mapping[str, Any] | None, body: Any, content_type: str,
                    timeout_s: float | None) -> Any:
        data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        try:
            async with self.session().request(
                    method, self.server + path, params=_params(params), data=data,
                    headers=await self.headers(content_type),
                    timeout=aiohttp.ClientTimeout(total=timeout_s or self.limits.timeout_s)) as resp:
                raw = await resp.read()
                self.requests[(method, resp.status)] += 1
                if resp.status >= 400:
                    raise _error(resp.status, raw, method, path)
                return orjson.loads(raw) if raw else None
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.requests[(method, 0)] += 1
            raise KubeError(0, type(exc).__name__, str(exc) or "no answer", method, path) from exc

    async def text(self, path: str, timeout_s: float | None = None) -> str:
        """A GET whose answer is text, not JSON (the API server's `/metrics`), within the limits."""
        await self.rate.acquire()
        async with self._slots:
            try:
                async with self.session().get(
                        self.server + path, headers={**await self.headers(), "Accept": "text/plain"},
                        timeout=aiohttp.ClientTimeout(total=timeout_s or self.limits.timeout_s)) as resp:
                    raw = await resp.read()
                    self.requests[("GET", resp.status)] += 1
                    if resp.status >= 400:
                        raise _error(resp.status, raw, "GET", path)
                    return raw.decode(errors="replace")
            except (TimeoutError, aiohttp.ClientError) as exc:
                self.requests[("GET", 0)] += 1
                raise KubeError(0, type(exc).__name__, str(exc) or "no answer", "GET", path) from exc

    async def watch(self, path: str, params: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch on `path` (a list path) from `params["resourceVersion"]`, until
        the server ends it (its `timeoutSeconds`). An ERROR event raises `KubeError`, and so
        does a connection refused or dropped (status 0, as `request` says it), or a line cut
        short: the caller backs off and watches again (a restarted API server)."""
        query = {**params, "watch": "true", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=float(params.get("timeoutSeconds", 300)) + 30)
        try:
            async with self.session().get(self.server + path, params=_params(query), headers=await self.headers(),
                                          timeout=timeout) as resp:
                self.requests[("WATCH", resp.status)] += 1
                if resp.status >= 400:
                    raise _error(resp.status, await resp.read(), "WATCH", path)
                # One event per line, of any length: aiohttp's line reader refuses a line over
                # 512 KiB (`LineTooLong`), and an object may be up to etcd's 1.5 MiB.
                pending = bytearray()
                async for chunk in resp.content.iter_any():
                    start = len(pending)
                    pending += chunk
                    end = pending.find(b"\n", start)
                    while end >= 0:
                        line = bytes(pending[:end])
                        del pending[:end + 1]
                        if line.strip():
                            yield _watch_event(line, path)
                        end = pending.find(b"\n")
                if pending.strip():
                    yield _watch_event(bytes(pending), path)
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            self.requests[("WATCH", 0)] += 1
            raise KubeError(0, type(exc).__name__, str(exc) or "no answer", "WATCH", path) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _watch_event(line: bytes, path: str) -> dict[str, Any]:
    """One watch event; an ERROR event raises `KubeError`."""
    event: dict[str, Any] = orjson.loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise KubeError(int(status.get("code", 500)), status.get("reason", ""), status.get("message", ""),
                        "WATCH", path)
    return event


def _params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    return {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in params.items() if v is not None}


def _error(status: int, raw: bytes, method: str, path: str) -> KubeError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return KubeError(status, str(body.get("reason", "")), str(body.get("message", raw[:200].decode(errors="replace"))),
                     method, path)


APPLY_PATCH = "application/apply-patch+yaml"


class Resources:
    """Where objects of a kind live (API discovery, cached): `path(apiVersion, kind, namespace,
    name)`; `apply` creates or updates an object by server-side apply."""

    def __init__(self, api: KubeApi, field_manager: str = "koordstream") -> None:
        self.api = api
        self.field_manager = field_manager
        self._kinds: dict[tuple[str, str], tuple[str, bool]] = {}  # (apiVersion, kind) -> (plural, namespaced)

    async def resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._kinds:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = await self.api.request("GET", base)
            for r in listing.get("resources", ()):
                if "/" not in r["name"]:
                    self._kinds[(api_version, r["kind"])] = (r["name"], bool(r["namespaced"]))
            if key not in self._kinds:
                raise KubeError(404, "NotFound", f"no resource of kind {kind} in {api_version}", "GET", base)
        return self._kinds[key]

    def forget(self, api_version: str) -> None:
        """Look the group up again (a CRD was just established)."""
        for key in [k for k in self._kinds if k[0] == api_version]:
            del self._kinds[key]

    async def path(self, api_version: str, kind: str, namespace: str = "", name: str = "") -> str:
        plural, namespaced = await self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        scope = f"/namespaces/{namespace}" if namespaced and namespace else ""
        return f"{base}{scope}/{plural}" + (f"/{name}" if name else "")

    async def apply(self, manifest: Mapping[str, Any]) -> Any:
        meta = manifest.get("metadata") or {}
        namespaced = (await self.resource(manifest["apiVersion"], manifest["kind"]))[1]
        namespace = meta.get("namespace", "default") if namespaced else ""
        path = await self.path(manifest["apiVersion"], manifest["kind"], namespace, meta["name"])
        return await self.api.request("PATCH", path, params={"fieldManager": self.field_manager, "force": True},
                                      body=dict(manifest), content_type=APPLY_PATCH)

    async def established(self, crd: Mapping[str, Any], timeout_s: float = 30.0) -> None:
        """Wait until a CustomResourceDefinition serves its kind."""
        spec = crd["spec"]
        kind = spec["names"]["kind"]
        versions = [f"{spec['group']}/{v['name']}" for v in spec.get("versions", ()) if v.get("served", True)]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                for version in versions:
                    self.forget(version)
                    await self.resource(version, kind)
                return
            except KubeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

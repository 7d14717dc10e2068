"""A web example app (FastAPI or aiohttp) driven through a broker outage, for the tests with
the embedded broker behind a FaultProxy (tests/test_integrations.py) and with a real Apache
Kafka node killed and restarted (tests/real_kafka/test_web_outage.py)."""

import asyncio
import importlib
import json
from typing import Any, Awaitable, Callable

from tests.support.readback import consume_all

DEADLINE_S, CLOSE_TIMEOUT_S = 1.0, 2.0  # the examples' SEND_DEADLINE_S and CLOSE_TIMEOUT_S


def _load(module: str) -> Any:
    """Import an example fresh, so it reads the environment set by the test."""
    return importlib.reload(importlib.import_module(module))


class _ExampleClient:
    """An example app, served in this loop by its framework's test client: post and get
    return (status, JSON body)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework

    async def __aenter__(self) -> "_ExampleClient":
        if self.framework == "fastapi":
            import httpx

            app = _load("examples.fastapi_app").app
            self._lifespan = app.router.lifespan_context(app)
            await self._lifespan.__aenter__()
            self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                             base_url="http://app")
        else:
            from aiohttp.test_utils import TestClient, TestServer

            app = _load("examples.aiohttp_app").make_app()
            self._client = TestClient(TestServer(app))
            await self._client.start_server()
        return self

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self._client.request(method, path, **kwargs)
        if self.framework == "fastapi":
            return response.status_code, response.json()
        return response.status, await response.json()

    async def __aexit__(self, *exc_info: object) -> None:
        if self.framework == "fastapi":
            await self._client.aclose()
            await self._lifespan.__aexit__(None, None, None)
        else:
            await self._client.close()  # (runs the app's cleanup: the producer's close)


async def outage(framework: str, bootstrap: str, topic: str, monkeypatch: Any,
                 go_away: Callable[[], Awaitable[None]],
                 come_back: Callable[[], Awaitable[None]], recover_s: float = 30) -> None:
    """Twenty events, then the broker goes away: each request answers 503 within its
    deadline and /ready says 503; once it is back (within delivery_timeout_ms), every event
    buffered before or during the outage is acknowledged and read back, once; then it goes
    away again and the app's shutdown ends within close_timeout."""
    for name, value in (("AIOPRODUCER_BOOTSTRAP", bootstrap), ("EVENTS_TOPIC", topic),
                        ("SEND_DEADLINE_S", str(DEADLINE_S)),
                        ("CLOSE_TIMEOUT_S", str(CLOSE_TIMEOUT_S))):
        monkeypatch.setenv(name, value)
    loop = asyncio.get_running_loop()
    app = _ExampleClient(framework)
    await app.__aenter__()
    try:
        for n in range(20):
            status, _ = await app.request("POST", "/events", json={"user": f"u{n % 4}", "n": n})
            assert status == 200
        assert (await app.request("GET", "/ready"))[0] == 200
        await go_away()
        for n in range(20, 25):
            began = loop.time()
            status, body = await app.request("POST", "/events", json={"user": f"u{n % 4}",
                                                                      "n": n})
            took = loop.time() - began
            assert (status, body) == (503, {"detail": "Kafka is unavailable (TimeoutError): "
                                                      "try again later"})
            assert DEADLINE_S <= took < DEADLINE_S + 0.5, took
        status, body = await app.request("GET", "/ready")
        assert status == 503 and body["ready"] is False and body["records_pending"] >= 5, body
        await come_back()
        for _ in range(int(recover_s * 10)):  # until everything buffered is acknowledged
            status, body = await app.request("GET", "/ready")
            if status == 200 and body["records_pending"] == 0:
                break
            await asyncio.sleep(0.1)
        assert (status, body["records_pending"]) == (200, 0), body
        await go_away()
        assert (await app.request("POST", "/events", json={"n": 25}))[0] == 503
    finally:
        began = loop.time()
        await asyncio.wait_for(app.__aexit__(), 30)
        shutdown_took = loop.time() - began
        await come_back()
    assert shutdown_took < CLOSE_TIMEOUT_S + 1, shutdown_took
    got = await asyncio.to_thread(consume_all, bootstrap, topic, expected=25)
    assert sorted(json.loads(r.value)["n"] for r in got) == list(range(25))

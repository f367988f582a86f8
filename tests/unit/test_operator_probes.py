"""The operator's liveness and readiness endpoints."""

from __future__ import annotations

import aiohttp
import pytest

from jobpool.k8s.probes import Health


async def get(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        return answer.status, await answer.json()


async def test_alive_while_waiting_ready_once_serving() -> None:
    health = Health("http://127.0.0.1:0/healthz")
    await health.start()
    try:
        base = f"http://127.0.0.1:{health.port}"
        health.waiting("the CRD jobworkerpools.jobs.mdm.io is not established")
        assert await get(f"{base}/healthz") == (200, {"alive": True})
        assert await get(f"{base}/readyz") == (503, {
            "ready": False, "waiting": "the CRD jobworkerpools.jobs.mdm.io is not established"})
        health.serving()
        assert await get(f"{base}/readyz") == (200, {"ready": True})
    finally:
        await health.stop()


def test_an_endpoint_that_is_not_http_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="must be http://HOST:PORT/PATH, got 'tcp://x:1'"):
        Health("tcp://x:1")


def test_other_paths_and_methods_are_refused() -> None:
    health = Health("http://127.0.0.1:0/livez")
    assert health.answer("GET", "/livez") == (200, {"alive": True})
    assert health.answer("GET", "/healthz")[0] == 404
    assert health.answer("POST", "/readyz")[0] == 405
    assert health.answer("GET", "/readyz") == (503, {"ready": False,
                                                     "waiting": "the operator is starting"})


async def test_head_answers_as_get_without_a_body_and_405_says_what_is_allowed() -> None:
    """Load balancers and uptime checks probe with HEAD: it was refused with 405."""
    health = Health("http://127.0.0.1:0/healthz")
    await health.start()
    try:
        base = f"http://127.0.0.1:{health.port}"
        async with aiohttp.ClientSession() as session:
            async with session.head(f"{base}/readyz") as answer:
                assert answer.status == 503
                assert await answer.read() == b""
            health.serving()
            async with session.head(f"{base}/healthz") as answer:
                assert answer.status == 200
            async with session.delete(f"{base}/healthz") as answer:
                assert answer.status == 405
                assert answer.headers["Allow"] == "GET, HEAD"
                assert await answer.json() == {"error": "DELETE is not allowed: GET, HEAD are"}
    finally:
        await health.stop()

"""The test servers' ports stay out of the kernel's ephemeral range, where any outgoing
connection could take a stopped server's port before it starts again."""

from __future__ import annotations

import random
import socket

import pytest
from ports import BROWSER_RESTRICTED, LOWEST, ephemeral_start, free_port


def test_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    ports = [free_port() for _ in range(50)]
    assert all(LOWEST <= port < ephemeral_start() for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if something holds it


def test_a_port_is_handed_out_once() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_a_port_browsers_refuse_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's browser tests would fail on it with ERR_UNSAFE_PORT."""
    drawn = iter([10080, 10080, *range(10081, 10200)])
    monkeypatch.setattr(random, "randrange", lambda *_: next(drawn))
    assert 10080 in BROWSER_RESTRICTED
    assert 10081 <= free_port() < 10200  # 10081 unless something holds it

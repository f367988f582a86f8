"""The test servers' ports stay out of the kernel's ephemeral range, where any outgoing
connection could take a stopped server's port before it starts again."""

from __future__ import annotations

import socket

from ports import LOWEST, ephemeral_start, free_port


def test_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    ports = [free_port() for _ in range(50)]
    assert all(LOWEST <= port < ephemeral_start() for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if something holds it


def test_a_port_is_handed_out_once() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)

"""Free TCP ports on 127.0.0.1 for the servers a test starts (PostgreSQL, PgBouncer, a
worker's probes, a proxy, the control plane).

Ports come from below the kernel's ephemeral range, never from it. A port handed out by
binding port 0 lies inside that range, and a server that is stopped and started again (a
database outage, a restart, a proxy cut) leaves its port unbound meanwhile: the kernel may
then give it as the source port of any outgoing connection, even of a client retrying
that very server (TCP connects such a socket to itself), and the start fails with
"Address already in use".

Nor ports that browsers refuse to connect to (Chromium's and Firefox's restricted ports; of
those handed out here, 10080), for the console's server that the browser tests open.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
"""The lowest port handed out: above the well-known and most registered services' ports."""
BROWSER_RESTRICTED = frozenset({10080})
"""The ports of [LOWEST, 32768) that browsers refuse to open a page on (ERR_UNSAFE_PORT)."""

_handed_out: set[int] = set()


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port in [LOWEST, the ephemeral range), not `BROWSER_RESTRICTED`, that nothing is
    bound to now and that this process has not handed out before.

    Raises RuntimeError when 1,000 tries find none (the range is full or too small)."""
    top = ephemeral_start()
    for _ in range(1000):
        port = random.randrange(LOWEST, max(top, LOWEST + 1))
        if port not in _handed_out and port not in BROWSER_RESTRICTED and _bindable(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in [{LOWEST}, {top}) on 127.0.0.1")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

"""Which addresses an outgoing webhook may connect to (issue 5: the SSRF guard).

Pure: the I/O layer resolves the host name, asks `refusals` about every address it got, and
connects only to addresses this module accepted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

METADATA_ADDRESSES: frozenset[Address] = frozenset({
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack instance metadata
    ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
    ipaddress.ip_address("fd00:ec2::254"),  # AWS instance metadata over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud metadata
})
"""Cloud metadata endpoints: refused unless allow-listed, whatever range they are in."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class TargetRefused(ValueError):
    """A webhook target resolves to an address the guard refuses; nothing was connected to."""


def parse_networks(text: str | None) -> tuple[Network, ...]:
    """Parse comma-separated CIDRs (`127.0.0.0/8, ::1/128`); raise ValueError naming a bad one."""
    networks: list[Network] = []
    for part in (text or "").split(","):
        entry = part.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"JOBPOOL_WEBHOOK_ALLOW_NETWORKS: {entry!r} is not a CIDR network "
                "(e.g. 127.0.0.0/8 or ::1/128)"
            ) from None
    return tuple(networks)


def embedded_ipv4(address: Address) -> IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d) or NAT64 IPv6 address."""
    if isinstance(address, IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _category(address: Address) -> str | None:
    """Why `address` is not a public unicast address, or None if it is one."""
    if address.is_unspecified:
        return "unspecified address"
    if address.is_loopback:
        return "loopback address"
    if address in METADATA_ADDRESSES:
        return "cloud metadata address"
    if address.is_link_local:
        return "link-local address"
    if address.is_multicast:
        return "multicast address"
    if address.is_reserved:
        return "reserved address"
    if address.is_private:
        return "private address"
    if not address.is_global:
        return "non-global address"
    return None


def refusal(address: Address, allow: Sequence[Network]) -> str | None:
    """The reason `address` is refused, or None when it may be connected to.

    An address inside an allow-listed network is accepted whatever it is; otherwise it must
    be a global unicast address, and so must the IPv4 address an IPv6 one embeds.
    """
    inner = embedded_ipv4(address)
    candidates: list[Address] = [address] if inner is None else [inner, address]
    if any(candidate in network for candidate in candidates for network in allow
           if candidate.version == network.version):
        return None
    for candidate in candidates:
        reason = _category(candidate)
        if reason is not None:
            return reason
    return None


def check_target(host: str, addresses: Iterable[Address], allow: Sequence[Network]) -> None:
    """Raise TargetRefused unless every address `host` resolved to may be connected to.

    One refused address refuses the host (a name mixing public and private answers is the
    DNS-rebinding pattern), and so does an empty answer.
    """
    resolved = list(addresses)
    if not resolved:
        raise TargetRefused(f"webhook target {host!r} resolved to no address")
    for address in resolved:
        reason = refusal(address, allow)
        if reason is not None:
            raise TargetRefused(
                f"webhook target {host!r} resolves to {address} ({reason}): refused, no "
                "connection made; allow it with JOBPOOL_WEBHOOK_ALLOW_NETWORKS"
            )

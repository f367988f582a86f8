"""Which URLs and addresses an outgoing webhook may go to (the SSRF guard).

Pure: `webhook_target` checks a URL's shape (when a subscription is created, and again before
every delivery, since rows can be written by plain SQL); the I/O layer then resolves the host
name, asks `check_target` about every address it got, and connects only to addresses this
module accepted.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from urllib.parse import urlsplit

import idna

from jobpool.errors import JobpoolError

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


MAX_URL_LENGTH = 2048
"""Characters of a webhook URL at most (the column's limit too)."""
_AUTHORITY = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>.*))?")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")
_USERINFO = re.compile(r"(?<=//)[^/?#]*@")


class TargetRefusedError(JobpoolError, ValueError):
    """A webhook target resolves to an address the guard refuses; nothing was connected to."""


class InvalidWebhookURLError(JobpoolError, ValueError):
    """A webhook URL that cannot be delivered to; the message names the problem."""


@dataclass(frozen=True)
class Target:
    """Where a webhook URL points: `host` is a lower-case DNS name or an IP literal."""

    scheme: str
    host: str
    port: int
    address: Address | None
    """The host when it is an IP literal (nothing to resolve)."""


def webhook_target(url: str) -> Target:
    """Check a webhook URL and say where it points; raise InvalidWebhookURLError naming the problem.

    url: `http://` or `https://`, a host and an optional port (1-65535), at most
    MAX_URL_LENGTH characters, no whitespace or control characters. Refused because they make
    the target ambiguous or unsafe to pin: user information (receivers verify signatures, and
    it would be stored and logged), IPv6 zone ids (they name an interface of one machine),
    numeric hosts other than dotted-decimal IPv4 (resolvers read `0x7f.1` as 127.0.0.1), and
    non-ASCII host names (IDNA 2003 and 2008 map some names to different hosts; the error
    gives the A-label form to use instead). Where the host resolves to is checked at delivery.
    """
    if not isinstance(url, str):
        raise InvalidWebhookURLError(f"a webhook URL must be a string, got {type(url).__name__}")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidWebhookURLError(
            f"webhook URL is {len(url)} characters long; at most {MAX_URL_LENGTH} are allowed")
    shown = _USERINFO.sub("***@", url)
    bad = next((c for c in url if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise InvalidWebhookURLError(f"webhook URL {shown!r} contains {bad!r} (whitespace or a "
                                "control character); percent-encode it")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidWebhookURLError(f"webhook URL {shown!r} cannot be parsed: {exc}") from None
    if parts.scheme not in ("http", "https") or not url.lower().startswith(
            f"{parts.scheme}://"):
        raise InvalidWebhookURLError(
            f"webhook URL must be an absolute http:// or https:// URL, got {shown!r}")
    if "@" in parts.netloc:
        raise InvalidWebhookURLError(
            f"webhook URL {shown!r} must not carry user information (user:password@): "
            "receivers authenticate a delivery by its signature")
    authority = _AUTHORITY.fullmatch(parts.netloc)
    if authority is None:
        raise InvalidWebhookURLError(f"webhook URL {url!r}: {parts.netloc!r} is not host[:port]")
    default_port = 443 if parts.scheme == "https" else 80
    host, address = _host(url, authority.group("host"))
    return Target(parts.scheme, host, _port(url, authority.group("port"), default_port), address)


def _port(url: str, text: str | None, default: int) -> int:
    """The port of `host:port`; an empty one means the scheme's default."""
    if not text:
        return default
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise InvalidWebhookURLError(f"webhook URL {url!r}: port {text!r} is not a number from 1 "
                                "to 65535")
    return int(text)


def _host(url: str, text: str) -> tuple[str, Address | None]:
    """The lower-case host of a URL and, for an IP literal, its address."""
    if not text:
        raise InvalidWebhookURLError(f"webhook URL {url!r} has no host")
    if text.startswith("["):
        inner = text[1:-1]
        if "%" in inner:
            raise InvalidWebhookURLError(f"webhook URL {url!r}: IPv6 zone ids ({inner!r}) are not "
                                    "allowed; they name a network interface of one machine")
        try:
            return inner.lower(), IPv6Address(inner)
        except ValueError:
            raise InvalidWebhookURLError(
                f"webhook URL {url!r}: {text!r} is not an IPv6 address") from None
    if not text.isascii():
        raise InvalidWebhookURLError(f"webhook URL {url!r}: host {text!r} {_a_label_hint(text)}")
    host = text.lower()
    labels = host.removesuffix(".").split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        try:
            return host, IPv4Address(host)
        except ValueError:
            raise InvalidWebhookURLError(
                f"webhook URL {url!r}: host {text!r} is neither a dotted-decimal IPv4 address "
                "(a.b.c.d) nor a host name") from None
    if len(host.removesuffix(".")) > 253 or not all(_LABEL.fullmatch(x) for x in labels):
        raise InvalidWebhookURLError(
            f"webhook URL {url!r}: host {text!r} is not a valid host name (dot-separated "
            "labels of letters, digits, '-' and '_', 1-63 characters each, 253 in all)")
    return host, None


def _a_label_hint(host: str) -> str:
    """Why a non-ASCII host is refused, with the A-label form to use when it has one."""
    try:
        ascii_form = idna.encode(host, uts46=True).decode("ascii")
    except UnicodeError as exc:  # idna.IDNAError and its kin
        return f"is not a valid internationalised domain name ({exc})"
    return f"is not ASCII; write it in its IDNA A-label form {ascii_form!r}"


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
    """The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d), 6to4 (2002:aabb:ccdd::/48)
    or NAT64 IPv6 address."""
    if isinstance(address, IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
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
    if isinstance(address, IPv6Address) and address.is_site_local:
        return "site-local address"  # fec0::/10: deprecated, still routed inside some sites
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
    """Raise TargetRefusedError unless every address `host` resolved to may be connected to.

    One refused address refuses the host (a name mixing public and private answers is the
    DNS-rebinding pattern), and so does an empty answer.
    """
    resolved = list(addresses)
    if not resolved:
        raise TargetRefusedError(f"webhook target {host!r} resolved to no address")
    for address in resolved:
        reason = refusal(address, allow)
        if reason is not None:
            raise TargetRefusedError(
                f"webhook target {host!r} resolves to {address} ({reason}): refused, no "
                "connection made; allow it with JOBPOOL_WEBHOOK_ALLOW_NETWORKS"
            )

"""Who an audit row's actor is: a person, an API token's subject, or a service account.

The audit log's `actor_principal_id` is text. A person (a CLI command's user) is written
`user:NAME`, an admin API token's subject `token:SUBJECT`; any other text is a service
account: a worker's `JOBPOOL_SERVICE_ACCOUNT`, or the database role of a statement that names
no actor (an enqueue from a service, the SQL function `mdm.enqueue_job`, the outbox trigger).
So the rows written before the prefixes existed read as service accounts too.
"""

from __future__ import annotations

from typing import Literal

from jobpool.core.jsondata import line_problem

ActorKind = Literal["person", "token", "service account"]

PERSON_PREFIX = "user:"
TOKEN_PREFIX = "token:"
SERVICE_PREFIX = "service:"
"""Accepted from `--actor` (a CLI command a machine runs, e.g. from cron) and dropped: bare text
is a service account."""
_PREFIXES: tuple[tuple[str, ActorKind], ...] = (
    (PERSON_PREFIX, "person"), (TOKEN_PREFIX, "token"))


def cli_actor(name: str) -> str:
    """The actor of a CLI command given `--actor name`: a person (`alice@host` ->
    `user:alice@host`), unless `name` already says it is one (`user:`) or says it is a
    machine (`service:NAME`, written as the bare NAME). `token:` is refused: it names an admin
    API token, which a command at the database is not, and the audit history would show the
    row as that token's.

    Raises ValueError for an empty name (an audit row must name someone), for one the audit
    log cannot store (a NUL, an undecodable byte of the command line) and for one that is not
    one printable line (the audit history prints it; the admin API refuses such a token
    `sub` for the same reason).
    """
    bare = name.removeprefix(SERVICE_PREFIX) if name.startswith(SERVICE_PREFIX) else None
    if (bare if bare is not None else name).startswith(TOKEN_PREFIX):
        raise ValueError(f"an actor of a command cannot be an admin API token ({name!r}): name "
                         f"a person (NAME or user:NAME) or a machine (service:NAME)")
    if not (bare if bare is not None else name).strip():
        raise ValueError(f"an actor must name someone, got {name!r}")
    problem = line_problem(name)
    if problem is not None:
        raise ValueError(f"an actor {problem}")
    if bare is not None:
        return bare
    return name if name.startswith(PERSON_PREFIX) else PERSON_PREFIX + name


def service_account_problem(name: str) -> str | None:
    """What keeps `name` from being a service account's name in audit rows, or None: it must
    name someone, be one printable line (the audit history prints it) and carry no kind's
    prefix (`user:`, `token:`), with which the audit history would show a worker's actions as
    a person's or an admin API token's."""
    if not name.strip():
        return f"must name the account, got {name!r}"
    for prefix, kind in _PREFIXES:
        if name.startswith(prefix):
            shown = "an admin API token" if kind == "token" else "a person"
            return (f"must be a bare name, got {name[:80]!r} (the prefix {prefix!r} marks an "
                    f"audit actor as {shown})")
    problem = line_problem(name)
    return None if problem is None else f"is not one printable line: it {problem}"


def token_subject(subject: str) -> str:
    """The actor of an admin API request: its token's `sub`."""
    return TOKEN_PREFIX + subject


def actor_kind(actor: str) -> ActorKind:
    """Which kind of principal `actor` names (text without a known prefix: a service account)."""
    for prefix, kind in _PREFIXES:
        if actor.startswith(prefix):
            return kind
    return "service account"


def actor_name(actor: str) -> str:
    """`actor` without its kind's prefix (what a person reads next to the kind)."""
    for prefix, _ in _PREFIXES:
        if actor.startswith(prefix):
            return actor[len(prefix):]
    return actor

"""Paused work: what a pause's scope is, which jobs it holds, how a person reads it.

A scope is a (tenant, kind) pair, a kind for every tenant (tenant None) or a tenant for every
kind (kind None). A pair is held while any scope covering it is paused; resuming one scope
does not resume another that covers the same pair (resuming a tenant leaves its paused pairs
paused). Pure: the rows come from `jobpool.pauses`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobpool.core.jsondata import line_problem

MAX_REASON = 500
"""Characters of a pause's reason (the database refuses more)."""


def check_scope(tenant: str | None, kind: str | None) -> None:
    """Raise ValueError unless a tenant, a kind, or both are named: a pause of everything
    would stop every worker, which is what scaling a pool to zero is for."""
    if tenant is None and kind is None:
        raise ValueError("name what to pause or resume: a tenant, a kind, or both")


def check_reason(reason: str | None) -> str | None:
    """`reason` stripped of spaces (None when empty); raises ValueError beyond MAX_REASON
    characters once stripped, for text PostgreSQL cannot store (a NUL from a URL's %00, a
    lone surrogate from an undecodable command-line byte) or that is not one printable line
    anywhere, a trailing line break too (`jobpool paused` prints it in a table, where an
    escape sequence would act on the terminal; the API's schema says the same)."""
    if reason is None or not reason.strip():
        return None
    problem = line_problem(reason)
    if problem is not None:
        raise ValueError(f"a pause's reason {problem}")
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        raise ValueError(f"a pause's reason is at most {MAX_REASON} characters, "
                         f"got {len(reason)}")
    return reason


def scope_text(tenant: str | None, kind: str | None) -> str:
    """`tenant acme, kind email_send`, `kind email_send (every tenant)` or `tenant acme
    (every kind)`: a scope as messages name it."""
    if tenant is not None and kind is not None:
        return f"tenant {tenant}, kind {kind}"
    if kind is not None:
        return f"kind {kind} (every tenant)"
    return f"tenant {tenant} (every kind)"


def covers(pause: Mapping[str, Any], tenant_id: Any, kind: str) -> bool:
    """Whether `pause` (a row with tenant_id and kind, None: every) holds the pair."""
    return ((pause["tenant_id"] is None or str(pause["tenant_id"]) == str(tenant_id))
            and (pause["kind"] is None or pause["kind"] == kind))


def overlaps(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether scopes `a` and `b` (rows with tenant_id and kind, None: every) hold a pair in
    common: after resuming `b`, a paused `a` still holds some of its jobs."""
    return ((a["tenant_id"] is None or b["tenant_id"] is None
             or str(a["tenant_id"]) == str(b["tenant_id"]))
            and (a["kind"] is None or b["kind"] is None or a["kind"] == b["kind"]))


def with_held_jobs(pauses: Sequence[Mapping[str, Any]],
                   counts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each pause with the jobs it holds: `pending` and `ready` (of its pairs, in the counts
    given: overview counts rows with tenant_id, kind, status, jobs, ready). A pair under two
    pauses is counted under both."""
    pending_rows = [c for c in counts if c["status"] == "pending"]
    shown = []
    for pause in pauses:
        held = [c for c in pending_rows if covers(pause, c["tenant_id"], str(c["kind"]))]
        shown.append({**pause, "pending": sum(int(c["jobs"]) for c in held),
                      "ready": sum(int(c["ready"]) for c in held)})
    return shown

"""The admin API's OpenAPI 3.0 document, served at /openapi.json (kept true by schemathesis)."""

from __future__ import annotations

from typing import Any, get_args

from jobpool.admin import (
    DEFAULT_PAGE,
    ERROR_PREVIEW_CHARS,
    MAX_JOB_ID,
    MAX_PAGE,
    PREVIEW_CHARS,
    PREVIEW_READ_LIMIT,
    STATUSES,
)
from jobpool.core.actors import ActorKind
from jobpool.core.jsondata import NOT_IN_A_LINE
from jobpool.core.kinds import KIND_NAME as KIND_NAME_RE
from jobpool.core.pause_scopes import MAX_REASON
from jobpool.core.tenants import TENANT_REF_PATTERN
from jobpool.db.live_workers import MAX_RUNNING_SHOWN

KIND_NAME = KIND_NAME_RE.pattern

_STATUS = {"type": "string", "enum": list(STATUSES)}
_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {**_TIME, "nullable": True}
_NULLABLE_TEXT = {"type": "string", "nullable": True}

_JOB = {
    "type": "object",
    "required": ["id", "tenant_id", "tenant_key", "job_kind", "status", "attempts",
                 "max_attempts", "priority", "created_at", "available_at"],
    "properties": {
        "id": {"type": "integer"},
        "tenant_id": {"type": "string", "format": "uuid"},
        "tenant_key": {"type": "string"},
        "job_kind": {"type": "string"},
        "payload": {},
        "status": _STATUS,
        "priority": {"type": "integer"},
        "available_at": _TIME,
        "created_at": _TIME,
        "claimed_by": _NULLABLE_TEXT,
        "claimed_at": _NULLABLE_TIME,
        "heartbeat_at": _NULLABLE_TIME,
        "attempts": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "last_error": _NULLABLE_TEXT,
        "completed_at": _NULLABLE_TIME,
        "idempotency_key": _NULLABLE_TEXT,
        "result": {"nullable": True},
        "trace_context": {"type": "object", "nullable": True,
                          "additionalProperties": {"type": "string"},
                          "description": "the enqueuer's W3C trace context (traceparent, "
                                         "tracestate); null without one"},
    },
    "additionalProperties": True,
}

_PAYLOAD_PREVIEW = {
    "payload_preview": {
        "type": "string", "nullable": True, "maxLength": PREVIEW_CHARS,
        "description": f"the first {PREVIEW_CHARS} characters of the payload's JSON text; "
                       f"null when it is stored in more than {PREVIEW_READ_LIMIT} bytes"},
    "payload_size": {"type": "integer", "minimum": 0,
                     "description": "bytes the payload is stored in (compressed)"},
    "payload_truncated": {"type": "boolean",
                          "description": "the preview is not the whole payload"},
}
_PAYLOAD_PREVIEW_FIELDS = list(_PAYLOAD_PREVIEW)

_DLQ_ITEM = {
    "type": "object",
    "description": "a DLQ job with previews of its payload and last error: a page's size does "
                   "not depend on theirs; the whole job is GET /v1/jobs/{id}",
    "required": ["id", "tenant_id", "tenant_key", "job_kind", "attempts", "dlq_at",
                 *_PAYLOAD_PREVIEW_FIELDS, "last_error_preview", "last_error_length",
                 "last_error_truncated"],
    "properties": {
        "id": {"type": "integer"},
        "tenant_id": {"type": "string", "format": "uuid"},
        "tenant_key": {"type": "string"},
        "job_kind": {"type": "string"},
        **_PAYLOAD_PREVIEW,
        "last_error_preview": {**_NULLABLE_TEXT, "maxLength": ERROR_PREVIEW_CHARS,
                               "description": f"the first {ERROR_PREVIEW_CHARS} characters "
                                              "of the last error"},
        "last_error_length": {"type": "integer", "minimum": 0,
                              "description": "characters of the whole last error"},
        "last_error_truncated": {"type": "boolean"},
        "attempts": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "created_at": _TIME,
        "dlq_at": _NULLABLE_TIME,
    },
    "additionalProperties": False,
}

_COUNT = {"type": "integer", "minimum": 0}
_TEXTS = {"type": "array", "items": {"type": "string"}}

_LANE_ACTIVITY = {
    "type": "object",
    "required": ["lane", "configured", "workers", "slots", "busy", "free", "claims_per_minute",
                 "completions_per_minute", "ready", "oldest_ready", "explanation"],
    "properties": {
        "lane": {"type": "string", "nullable": True,
                 "description": "null: workers started without a lane"},
        "configured": {"type": "boolean",
                       "description": "named by the pool file (else known from live workers)"},
        "workers": {**_COUNT, "description": "live workers"},
        "slots": _COUNT, "busy": _COUNT, "free": _COUNT,
        "claims_per_minute": {**_COUNT, "description": "jobs claimed in the last minute"},
        "completions_per_minute": {**_COUNT, "description": "jobs done in the last minute"},
        "ready": {**_COUNT, "description": "ready jobs the lane serves"},
        "oldest_ready": {
            "type": "object", "nullable": True,
            "description": "the (tenant, kind) whose oldest ready job waits longest",
            "required": ["tenant", "kind", "ready", "wait_seconds"],
            "properties": {"tenant": {"type": "string"}, "kind": {"type": "string"},
                           "ready": _COUNT, "wait_seconds": {"type": "number", "minimum": 0}}},
        "explanation": {**_NULLABLE_TEXT,
                        "description": "why the ready jobs wait; null when none wait"},
        "paused": {**_COUNT, "description": "ready jobs the lane serves that a pause holds "
                                            "(not in ready)"},
    },
}

_LIVE_WORKER = {
    "type": "object",
    "required": ["worker_id", "host", "pid", "pool", "lane", "kinds", "tenants", "slots",
                 "busy_slots", "started_at", "heartbeat_at", "last_claim_at",
                 "claims_last_minute", "completions_last_minute"],
    "properties": {
        "worker_id": {"type": "string", "description": "claimed_by of the jobs it runs"},
        "host": {"type": "string"}, "pid": {"type": "integer"},
        "pool": _NULLABLE_TEXT, "lane": _NULLABLE_TEXT,
        "kinds": _TEXTS, "tenants": {**_TEXTS, "description": "empty: every tenant"},
        "slots": _COUNT, "busy_slots": _COUNT,
        "started_at": _TIME, "heartbeat_at": _TIME, "last_claim_at": _NULLABLE_TIME,
        "claims_last_minute": _COUNT, "completions_last_minute": _COUNT,
    },
}

_RUNNING_JOB = {
    "type": "object",
    "required": ["id", "tenant", "kind", "holder", "claimed_at", "age_seconds", "lane",
                 "holder_live"],
    "properties": {
        "id": {"type": "integer"}, "tenant": {"type": "string"}, "kind": {"type": "string"},
        "holder": {"type": "string", "description": "the worker id that claimed it"},
        "claimed_at": _TIME, "age_seconds": {"type": "number", "minimum": 0},
        "lane": {**_NULLABLE_TEXT, "description": "the holder's lane"},
        "holder_live": {"type": "boolean",
                        "description": "false: the holder no longer beats; the claim waits "
                                       "for stale-claim recovery"},
    },
}

_OVERVIEW = {
    "type": "object",
    "required": ["now", "counts", "lanes", "activity", "workers", "running", "rate_limits",
                 "schedules", "paused"],
    "properties": {
        "now": _TIME,
        "counts": {"type": "array", "items": {
            "type": "object",
            "required": ["tenant", "tenant_id", "kind", "status", "jobs", "ready",
                         "ready_age_seconds"],
            "properties": {
                "tenant": {"type": "string"},
                "tenant_id": {"type": "string", "format": "uuid"},
                "kind": {"type": "string"},
                "status": _STATUS,
                "jobs": {"type": "integer", "minimum": 0},
                "ready": {"type": "integer", "minimum": 0,
                          "description": "pending jobs whose available_at has come"},
                "ready_age_seconds": {"type": "number", "minimum": 0,
                                      "description": "age of the oldest ready job; 0 if none"},
                "paused": {"type": "boolean",
                           "description": "a paused scope holds the (tenant, kind) pair"},
            }}},
        "lanes": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "kinds", "exclude_kinds", "tenants"],
            "properties": {
                "name": {"type": "string"},
                "kinds": {"type": "array", "items": {"type": "string"}, "nullable": True,
                          "description": "null: every kind exclude_kinds does not name"},
                "exclude_kinds": {"type": "array", "items": {"type": "string"}},
                "tenants": {"type": "array", "items": {"type": "string"},
                            "description": "empty: every tenant"},
                "workers_per_pod": {"type": "integer"},
                "min_replicas": {"type": "integer"},
                "max_replicas": {"type": "integer"},
                "autoscaling": {"type": "string"},
            }}},
        "activity": {"type": "array", "items": _LANE_ACTIVITY,
                     "description": "per lane: live workers, slots, rates, the ready "
                                    "backlog and why it waits"},
        "workers": {"type": "array", "items": _LIVE_WORKER,
                    "description": "workers whose heartbeat is recent"},
        "running": {"type": "array", "items": _RUNNING_JOB,
                    "description": "running jobs, longest-running first (at most "
                                   f"{MAX_RUNNING_SHOWN})"},
        "rate_limits": {"type": "array", "items": {
            "type": "object",
            "required": ["tenant", "kind", "rps", "burst", "waiting", "next_due_at"],
            "properties": {
                "tenant": {"type": "string"},
                "kind": {"type": "string", "description": "a kind, or * for the others"},
                "rps": {"type": "number"},
                "burst": {"type": "integer"},
                "waiting": {"type": "integer", "minimum": 0,
                            "description": "pending jobs not yet due (requeued or retrying)"},
                "next_due_at": _NULLABLE_TIME,
            }}},
        "schedules": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "owner", "kind", "tenant", "expression", "time_zone", "missed",
                         "next_run_at", "last_run_at", "last_job_id", "missed_total",
                         "last_error"],
            "properties": {
                "name": {"type": "string"},
                "owner": {"type": "string", "description": "the declaring pool: "
                          "`<namespace>/<name>`, a pool file's name; '' built in"},
                "kind": {"type": "string"},
                "tenant": {"type": "string", "description": "tenant key or id, as declared"},
                "expression": {"type": "string",
                               "description": "the cron expression, or 'every <n>s'"},
                "time_zone": {"type": "string", "nullable": True},
                "missed": {"type": "string", "enum": ["skip", "catch_up_once"]},
                "next_run_at": _TIME,
                "last_run_at": _NULLABLE_TIME,
                "last_job_id": {"type": "integer", "nullable": True},
                "missed_total": {"type": "integer", "minimum": 0,
                                 "description": "ticks dropped as missed or unenqueueable"},
                "last_error": {"type": "string", "nullable": True},
            }},
            "description": "schedules with their last and next run (docs/schedules.md)"},
        "paused": {"type": "array", "items": {"$ref": "#/components/schemas/Pause"},
                   "description": "the paused scopes holding the token's tenants"},
    },
}

_PAUSE = {
    "type": "object",
    "description": "a paused scope: a (tenant, kind) pair, a kind for every tenant (tenant "
                   "null) or a tenant for every kind (kind null)",
    "required": ["tenant", "tenant_id", "kind", "paused_by", "paused_at", "reason"],
    "properties": {
        "tenant": _NULLABLE_TEXT,
        "tenant_id": {"type": "string", "format": "uuid", "nullable": True},
        "kind": _NULLABLE_TEXT,
        "paused_by": {"type": "string", "description": "the actor who paused it"},
        "paused_at": _TIME,
        "reason": _NULLABLE_TEXT,
        "pending": {**_COUNT, "description": "pending jobs it holds (lists only)"},
        "ready": {**_COUNT, "description": "ready jobs it holds (lists only)"},
    },
}
_PAUSES = {"type": "object", "required": ["items"],
           "properties": {"items": {"type": "array",
                                    "items": {"$ref": "#/components/schemas/Pause"}}}}

_AUDIT_FIELDS = {
    "id": {"type": "integer"},
    "at": _TIME,
    "actor": {"type": "string", "description":
              "as stored: user:NAME (a person at the CLI), token:SUBJECT (an admin "
              "API token), else a service account"},
    "actor_kind": {"type": "string", "enum": list(get_args(ActorKind))},
    "actor_name": {"type": "string", "description": "the actor without its prefix"},
    "action": {"type": "string"},
}

_HISTORY = {
    "type": "object",
    "required": ["items"],
    "properties": {"items": {"type": "array", "items": {
        "type": "object",
        "description": "an audit row with a preview of its payload; the whole row is "
                       "GET /v1/audit/entries/{id}",
        "required": [*_AUDIT_FIELDS, *_PAYLOAD_PREVIEW_FIELDS],
        "properties": {**_AUDIT_FIELDS, **_PAYLOAD_PREVIEW},
        "additionalProperties": False,
    }}},
}

_AUDIT_ENTRY = {
    "type": "object",
    "required": [*_AUDIT_FIELDS, "job_id", "payload"],
    "properties": {**_AUDIT_FIELDS, "job_id": {"type": "integer", "nullable": True},
                   "payload": {}},
}

_PRINCIPAL = {
    "type": "object",
    "required": ["sub", "tenants"],
    "properties": {
        "sub": {"type": "string"},
        "tenants": {"oneOf": [{"type": "string", "enum": ["*"]},
                              {"type": "array", "items": {"type": "string"}}]},
    },
}

_PROBLEM = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
}


def _problem(description: str) -> dict[str, Any]:
    schema = {"$ref": "#/components/schemas/Problem"}
    return {"description": description,
            "content": {"application/problem+json": {"schema": schema}}}


def _ok(description: str, schema: dict[str, Any],
        links: dict[str, Any] | None = None) -> dict[str, Any]:
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    return {**response, "links": links} if links else response


def _job_links(source: str) -> dict[str, Any]:
    """Links from a response holding a job id (at JSON pointer `source`) to the job actions."""
    return {name: {"operationId": operation, "parameters": {"id": f"$response.body#{source}"}}
            for name, operation in (("GetJob", "getJob"), ("GetJobHistory", "getJobHistory"),
                                    ("ReplayJob", "replayJob"),
                                    ("StopJob", "stopJob"), ("DiscardJob", "discardJob"))}


_UNAUTHORIZED = {
    **_problem("missing, malformed, expired or wrongly signed token"),
    "headers": {"WWW-Authenticate": {
        "description": "Bearer, with the error (RFC 6750)", "schema": {"type": "string"}}},
}
_BODY = "a request body that cannot be read (e.g. a bad Content-Encoding)"
_COMMON_ERRORS = {
    "400": _problem(_BODY),
    "401": _UNAUTHORIZED,
    "403": _problem("the token lacks the manage_metadata permission or the tenants claim"),
    "413": _problem("request body too large (no endpoint takes one)"),
    "503": _problem("the database is unreachable"),
}
_JOB_ERRORS = {
    **_COMMON_ERRORS,
    "400": _problem(f"the job id is not an integer from 1 to 2^63-1, or {_BODY}"),
    "404": _problem("no job with that id among the token's tenants"),
}

_JOB_ID = {"name": "id", "in": "path", "required": True,
           "schema": {"type": "integer", "minimum": 1, "maximum": MAX_JOB_ID}}
_AUDIT_ID = {"name": "id", "in": "path", "required": True,
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_JOB_ID}}
_JOB_REF = {"$ref": "#/components/schemas/Job"}
_PAUSE_REF = {"$ref": "#/components/schemas/Pause"}
_SCOPE = [
    {"name": "tenant", "in": "query",
     "description": "tenant key or id; absent: every tenant (platform-wide tokens only)",
     "schema": {"type": "string", "pattern": TENANT_REF_PATTERN}},
    {"name": "kind", "in": "query", "description": "job kind; absent: every kind",
     "schema": {"type": "string", "pattern": KIND_NAME}},
]
_REASON = {"name": "reason", "in": "query",
           "description": "why, shown with the pause: one line of printable text",
           "schema": {"type": "string", "maxLength": MAX_REASON,
                      "pattern": f"^[^{NOT_IN_A_LINE}]*$"}}
_SCOPE_ERRORS = {
    **_COMMON_ERRORS,
    "400": _problem(f"a bad tenant, kind or reason, or {_BODY}"),
    "403": _problem("the token lacks manage_metadata or the tenants claim; or the request "
                    "names neither tenant nor kind (every kind of every tenant is never "
                    "paused), or no tenant with a token scoped to tenants"),
    "404": _problem("no tenant with that key or id among the token's tenants, or no such "
                    "registered kind"),
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of the admin API."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "jobpool admin API",
            "version": "1",
            "description": "Inspect and repair the job queue: DLQ list, replay, discard, stop, "
                           "pause and resume, counts. Every /v1 call needs a Bearer JWT "
                           "whose permissions contain manage_metadata; its sub is the audit "
                           "actor. Its tenants "
                           "claim (a list of tenant keys, or \"*\" for every tenant) limits "
                           "what it sees and changes: another tenant's job is a 404.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/dlq": {"get": {
                "operationId": "listDlq",
                "summary": "DLQ jobs, oldest first, keyset-paginated by id",
                "parameters": [
                    {"name": "tenant", "in": "query",
                     "description": "tenant key, or tenant id (a uuid, in any case)",
                     "schema": {"type": "string", "pattern": TENANT_REF_PATTERN}},
                    {"name": "kind", "in": "query",
                     "schema": {"type": "string", "pattern": KIND_NAME}},
                    {"name": "after", "in": "query", "description": "return ids above this",
                     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_JOB_ID,
                                "default": 0}},
                    {"name": "limit", "in": "query",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE,
                                "default": DEFAULT_PAGE}},
                ],
                "responses": {
                    "200": _ok("a page of the token's tenants' DLQ jobs; next_after is null "
                               "on the last page", {
                        "type": "object", "required": ["items", "next_after"],
                        "properties": {
                            "items": {"type": "array",
                                      "items": {"$ref": "#/components/schemas/DlqJob"}},
                            "next_after": {"type": "integer", "nullable": True},
                        }}, _job_links("/items/0/id")),
                    **_COMMON_ERRORS,
                    "400": _problem(f"a bad filter (tenant, kind, after or limit), or {_BODY}"),
                    "404": _problem("no tenant with that key or id among the token's tenants"),
                },
            }},
            "/v1/jobs/{id}": {
                "parameters": [_JOB_ID],
                "get": {"operationId": "getJob", "summary": "every column of one job",
                        "responses": {"200": _ok("the job", _JOB_REF), **_JOB_ERRORS}},
                "delete": {
                    "operationId": "discardJob",
                    "summary": "discard (delete) a DLQ or stopped job; audited with a "
                               "snapshot of the row",
                    "responses": {"204": {"description": "discarded"},
                                  "409": _problem("the job is not in the DLQ or stopped"),
                                  **_JOB_ERRORS}},
            },
            "/v1/audit/jobs/{id}": {"parameters": [_JOB_ID], "get": {
                "operationId": "getJobHistory",
                "summary": "the job's audit rows, oldest first (also after a discard)",
                "responses": {"200": _ok("the audit rows", _HISTORY, {"GetAuditEntry": {
                    "operationId": "getAuditEntry",
                    "parameters": {"id": "$response.body#/items/0/id"}}}), **_JOB_ERRORS}}},
            "/v1/audit/entries/{id}": {"parameters": [_AUDIT_ID], "get": {
                "operationId": "getAuditEntry",
                "summary": "one audit row with its whole payload (a discard's snapshot of "
                           "the job)",
                "responses": {"200": _ok("the audit row", _AUDIT_ENTRY), **_COMMON_ERRORS,
                              "400": _problem("the id is not an integer from 1 to 2^63-1, "
                                              f"or {_BODY}"),
                              "404": _problem("no audit row with that id among the token's "
                                              "tenants")}}},
            "/v1/jobs/{id}/replay": {"parameters": [_JOB_ID], "post": {
                "operationId": "replayJob",
                "summary": "put a DLQ job back to pending with attempts 0; audited",
                "responses": {"200": _ok("the replayed job", _JOB_REF, _job_links("/id")),
                              "409": _problem("the job is not in the DLQ"), **_JOB_ERRORS}}},
            "/v1/jobs/{id}/stop": {"parameters": [_JOB_ID], "post": {
                "operationId": "stopJob",
                "summary": "set the manual stop flag (status failed); audited",
                "responses": {"200": _ok("the stopped job", _JOB_REF, _job_links("/id")),
                              "409": _problem("the job is done or already stopped"),
                              **_JOB_ERRORS}}},
            "/v1/pauses": {
                "get": {"operationId": "listPauses",
                        "summary": "the paused scopes holding the token's tenants, oldest "
                                   "first, with the jobs each holds",
                        "responses": {"200": _ok("the paused scopes", _PAUSES),
                                      **_COMMON_ERRORS}},
                "post": {"operationId": "pause",
                         "summary": "pause a scope: its ready jobs stay pending, unclaimed "
                                    "(no attempt used), until resumed; running jobs finish; "
                                    "audited",
                         "parameters": [*_SCOPE, _REASON],
                         "responses": {"201": _ok("paused", _PAUSE_REF),
                                       "200": _ok("paused already (by whom, since when)",
                                                  _PAUSE_REF),
                                       **_SCOPE_ERRORS}},
                "delete": {"operationId": "resume",
                           "summary": "resume a paused scope (as it was paused: resuming a "
                                      "tenant leaves its paused pairs paused); audited",
                           "parameters": _SCOPE,
                           "responses": {"200": _ok("the pause that ended", _PAUSE_REF),
                                         "409": _problem("the scope is not paused"),
                                         **_SCOPE_ERRORS}},
            },
            "/v1/me": {"get": {
                "operationId": "whoami",
                "summary": "the token's subject and tenant scope",
                "responses": {"200": _ok("the principal", _PRINCIPAL), **_COMMON_ERRORS}}},
            "/v1/overview": {"get": {
                "operationId": "overview",
                "summary": "pending, running and DLQ jobs per tenant, kind and status with "
                           "the ready backlog's age, the pool's lanes with their live "
                           "workers, running jobs and why their backlog waits, rate-limited "
                           "(tenant, kind) pairs, paused scopes",
                "responses": {"200": _ok("the overview", _OVERVIEW), **_COMMON_ERRORS}}},
            "/v1/stats": {"get": {
                "operationId": "stats",
                "summary": "job counts per tenant, kind and status, and totals per status",
                "responses": {"200": _ok("counts", {
                    "type": "object", "required": ["counts", "totals"],
                    "properties": {
                        "counts": {"type": "array", "items": {
                            "type": "object",
                            "required": ["tenant", "tenant_id", "kind", "status", "jobs"],
                            "properties": {
                                "tenant": {"type": "string"},
                                "tenant_id": {"type": "string", "format": "uuid"},
                                "kind": {"type": "string"}, "status": _STATUS,
                                "jobs": {"type": "integer", "minimum": 0}}}},
                        "totals": {"type": "object",
                                   "additionalProperties": {"type": "integer", "minimum": 0}},
                    }}), **_COMMON_ERRORS}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "bearerFormat": "JWT"}},
            "schemas": {"Job": _JOB, "DlqJob": _DLQ_ITEM, "Pause": _PAUSE,
                        "Problem": _PROBLEM},
        },
    }

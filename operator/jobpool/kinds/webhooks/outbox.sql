-- The outbox: events, webhook subscriptions, deliveries (kind outbox_dispatch).
-- An event's insert enqueues its outbox_dispatch job through a trigger (migration 0002).

-- name: insert_outbox_event :one
-- Write one event; the trigger enqueues its outbox_dispatch job in the same transaction.
INSERT INTO mdm.aa_outbox_event (tenant_id, event_type, payload)
VALUES (%(tenant_id)s, %(event_type)s, %(payload)s::jsonb)
RETURNING id, uid, tenant_id, event_type, created_at;

-- name: insert_webhook_subscription :one
-- Add a webhook subscription of a tenant.
INSERT INTO mdm.aa_webhook_subscription (tenant_id, url, secret, event_types)
VALUES (%(tenant_id)s, %(url)s, %(secret)s, %(event_types)s::text[])
RETURNING id, tenant_id, url, event_types, active, created_at;

-- name: lock_outbox_event :one
-- The event to fan out, locked against a concurrent fan-out of the same event. The payload
-- comes as PostgreSQL renders the jsonb (numbers digit for digit, never through a float);
-- occurred_at is created_at in RFC 3339 UTC, NULL outside the years 0001-9999 it can carry.
SELECT id, event_type, payload::text AS data_json, dispatched_at IS NOT NULL AS dispatched,
       created_at::text AS created_at_text,
       CASE WHEN created_at >= '0001-01-01 00:00:00+00' AND created_at < '10000-01-01 00:00:00+00'
            THEN to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
       END AS occurred_at
  FROM mdm.aa_outbox_event
 WHERE id = %(id)s
   FOR UPDATE;

-- name: fan_out_outbox_event :many
-- Fix the event's body, mark it dispatched, and create one delivery per matching subscription.
WITH dispatched AS (
    UPDATE mdm.aa_outbox_event
       SET body = %(body)s, dispatched_at = now()
     WHERE id = %(id)s AND dispatched_at IS NULL
    RETURNING id, uid, tenant_id, event_type
)
INSERT INTO mdm.aa_webhook_delivery (event_id, subscription_id, tenant_id, webhook_id)
SELECT d.id, s.id, d.tenant_id, 'msg_' || replace(d.uid::text, '-', '') || '_' || s.id
  FROM dispatched d
  JOIN mdm.aa_webhook_subscription s
    ON s.tenant_id = d.tenant_id AND s.active
   AND (d.event_type = ANY(s.event_types) OR '*' = ANY(s.event_types))
 ORDER BY s.id
ON CONFLICT ON CONSTRAINT aa_webhook_delivery_once DO NOTHING
RETURNING id, tenant_id, webhook_id;

-- name: set_delivery_jobs :exec
-- Remember which job delivers which delivery.
UPDATE mdm.aa_webhook_delivery d
   SET job_id = j.job_id
  FROM unnest(%(ids)s::bigint[], %(job_ids)s::bigint[]) AS j(id, job_id)
 WHERE d.id = j.id;

-- name: delivery_to_send :one
-- A delivery with what sending it needs: the event's fixed body, the subscription, the time.
SELECT d.id, d.tenant_id, d.webhook_id, d.status::text AS status, d.attempts,
       e.body, e.event_type, s.id AS subscription_id, s.url, s.secret, s.active,
       clock_timestamp() AS db_now, floor(extract(epoch FROM clock_timestamp()))::bigint AS now_epoch
  FROM mdm.aa_webhook_delivery d
  JOIN mdm.aa_outbox_event e ON e.id = d.event_id
  JOIN mdm.aa_webhook_subscription s ON s.id = d.subscription_id
 WHERE d.id = %(id)s;

-- name: record_delivered :exec
-- The receiver answered 2xx.
UPDATE mdm.aa_webhook_delivery
   SET status = 'delivered', attempts = attempts + 1, last_status_code = %(status_code)s,
       last_error = NULL, last_attempt_at = now(), delivered_at = now()
 WHERE id = %(id)s;

-- name: record_delivery_attempt :exec
-- A failed attempt (committed apart from the job's transaction, which rolls back).
UPDATE mdm.aa_webhook_delivery
   SET status = %(status)s::mdm.webhook_delivery_status, attempts = attempts + 1,
       last_status_code = %(status_code)s, last_error = left(%(error)s, 4000),
       last_attempt_at = now()
 WHERE id = %(id)s AND status IN ('pending', 'failed');

-- name: record_delivery_skipped :exec
-- Nothing sent: the subscription is no longer active.
UPDATE mdm.aa_webhook_delivery
   SET status = 'skipped', last_error = left(%(reason)s, 4000)
 WHERE id = %(id)s AND status IN ('pending', 'failed');

-- name: record_gone :one
-- The receiver answered 410: the delivery is gone, the subscription deactivated and audited.
WITH delivery AS (
    UPDATE mdm.aa_webhook_delivery
       SET status = 'gone', attempts = attempts + 1, last_status_code = 410,
           last_error = left(%(reason)s, 4000), last_attempt_at = now()
     WHERE id = %(id)s
    RETURNING subscription_id
), deactivated AS (
    UPDATE mdm.aa_webhook_subscription s
       SET active = false, deactivated_at = now(), deactivated_reason = left(%(reason)s, 4000)
      FROM delivery
     WHERE s.id = delivery.subscription_id AND s.active
    RETURNING s.id, s.tenant_id, s.url
), audited AS (
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    SELECT %(actor)s, tenant_id, %(job_id)s, 'webhook_disabled',
           jsonb_build_object('subscription_id', id, 'url', url, 'reason', %(reason)s::text)
      FROM deactivated
)
SELECT count(*)::int AS deactivated FROM deactivated;

-- name: compact_outbox_events :one
-- Delete one batch of events dispatched before the retention period whose deliveries settled.
WITH doomed AS (
    SELECT e.id
      FROM mdm.aa_outbox_event e
     WHERE e.dispatched_at < now() - make_interval(secs => %(retention)s)
       AND NOT EXISTS (
           SELECT 1
             FROM mdm.aa_webhook_delivery d
             JOIN mdm.aa_job j ON j.id = d.job_id
            WHERE d.event_id = e.id AND d.status = 'pending'
              AND j.status IN ('pending', 'running'))
     ORDER BY e.dispatched_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM mdm.aa_outbox_event e USING doomed WHERE e.id = doomed.id RETURNING e.id
)
SELECT count(*)::int AS deleted FROM deleted;

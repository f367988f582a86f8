-- The end of a job whose handler wrote, as two function calls, so that the worker sends its
-- `done`, COMMIT and session reset in one simple-protocol query: the functions' statements
-- keep cached plans, where the same statements sent as text would be planned anew per job.
-- Every name inside is schema-qualified: a handler's search_path is still in force when they run.

-- Mark job p_id done (result p_result) if worker p_worker_id still holds attempt p_attempts of
-- it, with the audit row of the finished job. Returns whether it did; a claim no longer held
-- raises SQLSTATE JP001 instead when p_require_claim is set, so that the transaction (and the
-- COMMIT sent after it in the same query) does not commit the handler's writes.
CREATE FUNCTION mdm.aa_job_done(p_id bigint, p_attempts integer, p_worker_id text,
                                p_actor text, p_result jsonb, p_require_claim boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    done_tenant uuid;
    done_kind text;
BEGIN
    UPDATE mdm.aa_job
       SET status = 'done', completed_at = pg_catalog.clock_timestamp(), last_error = NULL,
           heartbeat_at = NULL, lease_expires_at = NULL, result = p_result
     WHERE id = p_id AND status = 'running' AND claimed_by = p_worker_id
       AND attempts = p_attempts
    RETURNING tenant_id, job_kind INTO done_tenant, done_kind;
    IF NOT FOUND THEN
        IF p_require_claim THEN
            RAISE EXCEPTION 'job % is no longer running under attempt % of worker %',
                p_id, p_attempts, p_worker_id USING ERRCODE = 'JP001';
        END IF;
        RETURN false;
    END IF;
    INSERT INTO mdm.aa_audit_log (actor_principal_id, tenant_id, job_id, action, payload)
    VALUES (p_actor, done_tenant, p_id, 'job_done',
            pg_catalog.jsonb_build_object('kind', done_kind));
    RETURN true;
END
$$;

-- Undo what a job's handler left in its session (run after `SET SESSION AUTHORIZATION
-- DEFAULT`, as the worker's own role): what DISCARD ALL does but DEALLOCATE ALL, which would
-- drop the client's protocol-level prepared statements. Returns how many of those are left
-- (a handler may have deallocated some) and the names of the statements SQL PREPARE made (a
-- handler's: they may hold the names the client gives its own next). The function has no SET
-- clause, so the settings RESET ALL restores stay restored when it returns.
CREATE FUNCTION mdm.aa_reset_session()
RETURNS TABLE (prepared integer, handler_made text[]) LANGUAGE plpgsql AS $$
BEGIN
    RESET ALL;
    UNLISTEN *;
    EXECUTE 'CLOSE ALL';
    PERFORM pg_catalog.pg_advisory_unlock_all();
    DISCARD TEMP;
    DISCARD SEQUENCES;
    RETURN QUERY
        SELECT pg_catalog.count(*) FILTER (WHERE NOT s.from_sql)::integer,
               pg_catalog.array_agg(s.name) FILTER (WHERE s.from_sql)
          FROM pg_catalog.pg_prepared_statements s;
END
$$;

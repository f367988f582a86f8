-- The session reset of a writing job now runs inside the job's transaction, after its `done`
-- (`mdm.aa_job_end`) and just before its COMMIT, so that the job costs one transaction, not
-- two (a statement after a COMMIT is a transaction of its own). A handler's
-- `synchronous_commit` (SET or SET LOCAL) must still decide how its commit waits: the reset
-- keeps the value in force for the rest of the transaction (SET LOCAL after RESET ALL), and
-- the session's own value is the reset one once the transaction ends. Run in a transaction of
-- its own (a worker resetting a session after a failed job), that local value ends at once and
-- changes nothing.
-- Same signature and result as before, so that a worker of the previous release keeps working.
-- Every name inside is schema-qualified: a handler's search_path is still in force.
CREATE OR REPLACE FUNCTION mdm.aa_reset_session()
RETURNS TABLE (prepared integer, handler_made text[]) LANGUAGE plpgsql AS $$
DECLARE
    commit_durability text := pg_catalog.current_setting('synchronous_commit');
BEGIN
    RESET ALL;
    PERFORM pg_catalog.set_config('synchronous_commit', commit_durability, true);
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

-- What a writing job's end runs before its session reset, in one call (each statement of a
-- query costs the server and the worker a round of its own), after the handler's deferred
-- constraints were checked (`SET CONSTRAINTS ALL IMMEDIATE`, sent apart, under the handler's
-- role, so that its failure is told from the `done`'s): the job's `done` (`mdm.aa_job_done`;
-- a claim no longer held raises SQLSTATE JP001); no statement timeout for the rest of the
-- transaction (the handler's would cut the reset short and roll the job back); and the
-- worker's own role again, so that the reset runs as it. No SET clause: what it sets must
-- outlast the call.
CREATE OR REPLACE FUNCTION mdm.aa_job_end(p_id bigint, p_attempts integer,
                                          p_worker_id text, p_actor text, p_result jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mdm.aa_job_done(p_id, p_attempts, p_worker_id, p_actor, p_result, true);
    PERFORM pg_catalog.set_config('statement_timeout', '0', true);
    SET SESSION AUTHORIZATION DEFAULT;
END
$$;

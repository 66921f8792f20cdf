-- Claim and completion batches keep their arrays uncompressed up to a page.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- lease_claim_batches and receipt_completion_batches hold a batch's job ids, leases, slots and
-- attempts as arrays, about 32 and 16 bytes a job. A row over 2 kB (a claim batch of about 60
-- jobs, a completion batch of about 120) was compressed when inserted, and a completion read a
-- compressed claim batch's arrays by decompressing them again for every attempt it looked up. With
-- batches of 128 jobs, compressing and decompressing were a sixth of the server's instructions for
-- an enqueue, claim and completion (bench/cycle-instructions.sh). toast_tuple_target = 8160 (a
-- page) keeps rows uncompressed up to that size: a claim batch of up to about 250 jobs, which
-- covers claims up to the default claim_ahead of 224. Larger rows are compressed as before. The
-- cost is WAL: an uncompressed row is logged whole. A storage parameter of each partition, since
-- a partitioned table has none; the rings' partitions are made once, with the schema.
DO $$
DECLARE
    v_partition regclass;
BEGIN
    FOR v_partition IN
        SELECT i.inhrelid::regclass FROM pg_inherits i
        WHERE i.inhparent IN ('__S__.lease_claim_batches'::regclass, '__S__.receipt_completion_batches'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s SET (toast_tuple_target = 8160)', v_partition);
    END LOOP;
END
$$;

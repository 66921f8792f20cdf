-- Batch rows' arrays compressed with lz4 instead of pglz, where the server has lz4.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- A claim batch keeps six arrays a row and a completion batch two; an archive row seven, of up to
-- 256 jobs. Past about 2 kB a row, PostgreSQL compresses its largest values before it stores the
-- row: at a claim of 128 jobs, four of the claim row's arrays and one of the completion row's,
-- each a pglz call of about 440,000 instructions, a tenth of the server's work of the whole
-- enqueue, claim and completion of those jobs. lz4 compresses the same values in a fraction of
-- that (the cycle went from 21.5 to 19.6 million instructions) and only slightly larger (a claim
-- row of 128 jobs 1,832 bytes against 1,728). Nothing reads these arrays often enough for the
-- decompression to matter, and lz4's is faster too.
--
-- SET COMPRESSION does not recurse to partitions, so every child is set, and the parent for any
-- partition made later. A server built without lz4 refuses the setting; it keeps pglz there.
-- Only the catalog changes (no table is rewritten), but each ALTER takes its table's ACCESS
-- EXCLUSIVE lock until the migration commits: the three tables and their partitions are locked
-- first, in one statement and in the order claims, completions and the archive copy take them,
-- so that a migration run beside working processes waits for them rather than deadlocking with
-- one that holds a table it altered and waits for another.
DO $$
DECLARE
    r record;
BEGIN
    LOCK TABLE __S__.lease_claim_batches, __S__.receipt_completion_batches,
               __S__.archived_completion_batches IN ACCESS EXCLUSIVE MODE;
    FOR r IN
        SELECT c.oid::regclass AS rel, a.attname
          FROM pg_class c
          JOIN pg_attribute a ON a.attrelid = c.oid
         WHERE c.relnamespace = '__S__'::regnamespace
           AND c.relkind IN ('r', 'p')
           AND (c.oid IN ('__S__.lease_claim_batches'::regclass,
                          '__S__.receipt_completion_batches'::regclass,
                          '__S__.archived_completion_batches'::regclass)
                OR c.oid IN (SELECT inhrelid FROM pg_inherits
                              WHERE inhparent IN ('__S__.lease_claim_batches'::regclass,
                                                  '__S__.receipt_completion_batches'::regclass,
                                                  '__S__.archived_completion_batches'::regclass)))
           AND a.attnum > 0 AND NOT a.attisdropped
           AND EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = a.atttypid AND t.typcategory = 'A')
    LOOP
        EXECUTE format('ALTER TABLE ONLY %s ALTER COLUMN %I SET COMPRESSION lz4', r.rel, r.attname);
    END LOOP;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END $$;

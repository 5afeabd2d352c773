-- A `volcano locks run` job's SQL, fenced without any driver: psql gets the
-- fencing token as :fence (-v fence="$VOLCANO_FENCING_TOKEN"); with
-- ON_ERROR_STOP=1 a stale token exits 3 and writes nothing. Needs the
-- volcano_fences table (volcano_fence's migrate) and, here, a reports table.
BEGIN;
WITH checked AS (
  INSERT INTO volcano_fences AS f (resource, fence, updated_at)
  VALUES ('nightly-report', :'fence'::bigint, now())
  ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, updated_at = now()
  WHERE f.fence <= EXCLUDED.fence
  RETURNING 1
)
SELECT count(*) AS fence_ok FROM checked \gset
\if :fence_ok
  UPDATE reports SET body = 'done by ' || :'fence' WHERE name = 'nightly';  -- the job's writes
  COMMIT;
\else
  ROLLBACK;
  DO $$ BEGIN RAISE EXCEPTION 'stale fencing token: the lock changed hands; nothing written'; END $$;
\endif

-- A `volcano locks run` job's SQL, fenced without any driver: psql gets the
-- fencing token as :fence (-v fence="$VOLCANO_FENCING_TOKEN"). The check is
-- one statement (volcano_fence's Table::check_statement): it records the
-- fence and locks the resource's row, and a stale token fails it (SQLSTATE
-- VF001), which aborts the transaction; with ON_ERROR_STOP=1 psql then
-- exits 3 and nothing is written. Needs public.volcano_fences and its
-- function (volcano_fence's migrate) and, here, a reports table.
BEGIN;
INSERT INTO public.volcano_fences AS f (resource, fence, updated_at)
VALUES ('nightly-report', :'fence'::bigint, now())
ON CONFLICT (resource) DO UPDATE SET
  fence = CASE WHEN f.fence <= EXCLUDED.fence THEN EXCLUDED.fence
          ELSE public.volcano_fence_refuse(f.resource, EXCLUDED.fence, f.fence) END,
  updated_at = now();
UPDATE reports SET body = 'done by ' || :'fence' WHERE name = 'nightly';  -- the job's writes
COMMIT;

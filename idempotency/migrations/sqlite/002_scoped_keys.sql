-- Keys scoped to their caller (Config.Scope) are stored as a digest of the
-- caller, then the key. SQLite's TEXT column has room already: nothing to
-- change, the version is recorded so both dialects stay in step.
SELECT 1;

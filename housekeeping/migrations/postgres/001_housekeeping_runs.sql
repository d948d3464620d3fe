-- When each housekeeping task last ran, whichever instance ran it: an
-- instance runs a task only when a whole period has passed since, so with
-- several instances each task runs once per period.
CREATE TABLE IF NOT EXISTS bento_housekeeping (
    task   VARCHAR(64) PRIMARY KEY,
    ran_at TIMESTAMPTZ NOT NULL
);

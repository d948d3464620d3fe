-- When each housekeeping task last ran, whichever instance ran it: an
-- instance runs a task only when a whole period has passed since, so with
-- several instances each task runs once per period.
CREATE TABLE IF NOT EXISTS bento_housekeeping (
    task   TEXT PRIMARY KEY,
    ran_at DATETIME NOT NULL
);

-- Notify only when a projector waits for one. PostgreSQL holds a
-- database-wide lock from queuing a transaction's notification until its
-- commit is flushed, so writers that notify wait for each other's WAL
-- flush; a busy projector claims again at once and needs no notification.
--
-- Each listening projector keeps a row here: idle while it sleeps, not idle
-- while it works through full batches. The trigger notifies only when some
-- projector is idle. It takes a shared advisory lock (one key per schema)
-- before it reads the rows, and a projector going idle takes the same key
-- exclusively after committing its row, which waits for every writer that
-- may have read the old state: by then their events are committed, and the
-- projector's next claim sees them. Writers that start later notify.
CREATE TABLE IF NOT EXISTS bento_outbox_relays (
    worker_id  VARCHAR(128) PRIMARY KEY,
    idle       BOOLEAN      NOT NULL DEFAULT true,
    changed_at TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION outbox_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext(TG_TABLE_SCHEMA || '.bento_outbox_relays'));
    IF EXISTS (SELECT 1 FROM bento_outbox_relays WHERE idle) THEN
        PERFORM pg_notify('bento_outbox', TG_TABLE_SCHEMA || ':' || NEW.tenant_id);
    END IF;
    RETURN NULL;
END
$$;

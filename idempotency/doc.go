// Package idempotency makes HTTP commands safe to retry: net/http middleware
// for the Idempotency-Key request header, backed by a ledger table in the
// application's own database (PostgreSQL or SQLite).
//
// A client that sends a command (typically a POST) with an Idempotency-Key
// may send it again after a timeout or a lost connection without the
// command taking effect twice: the first request runs, a repeat gets the
// first one's response back.
//
//	// after idempotency.Migrate(ctx, db)
//	ledger, err := idempotency.New(db, &idempotency.Config{Caller: userID})
//	// ...
//	mux.Handle("POST /orders", ledger.Middleware(createOrder))
//
// The handler finds the ledger's transaction in its request's context and
// must do its database work through it — uow.DB(r.Context(), db), or a unit
// of work begun with r.Context(), which joins it — so that its effects and
// the stored response commit together.
//
// # Semantics
//
// Requests without an Idempotency-Key header pass straight through to the
// next handler, whatever their method. Requests with one, of any method, are
// handled as follows.
//
// The key is 1 to 255 characters of printable ASCII (0x20 to 0x7E), taken
// verbatim (quotes included, if the client sends any). An empty, over-long or
// otherwise malformed key, or the header sent more than once, gets 400 Bad
// Request. A request body larger than [Config.MaxBodyBytes] gets 413 Content
// Too Large; a tenant (see below) that is not a valid tenant id, 400. None
// of them reaches the handler. Every response the middleware makes itself is
// an RFC 9457 problem (Content-Type application/problem+json) whose "type"
// is one of the Problem constants ([ProblemInvalidKey] and so on), or
// about:blank.
//
// Keys are scoped by tenant ([Config.Tenant]) and, within a tenant, by
// caller ([Config.Caller]): the same key sent for two tenants, or by two
// callers, is two keys, so nobody gets another caller's stored response by
// reusing or guessing its key. A keyed request whose Caller fails gets 401
// ([ProblemNoCaller]) and runs nothing. Each key remembers a digest of its
// request: SHA-256 over the method, the path (with "?" and the raw query
// when there is one) and the body, each length-prefixed (see
// [RequestDigest]). Headers are not part of it.
//
// Each keyed request runs in ONE database transaction, which:
//
//  1. inserts the key's row (state in_progress) with an insert that cannot
//     duplicate (ON CONFLICT DO NOTHING);
//  2. if the row is new, calls the handler with a request whose context
//     carries the transaction (uow.Owned.Join) and the tenant
//     (tenant.With), and whose body is a fresh reader over the buffered
//     body; the response is recorded, not sent;
//  3. if the handler's status is not a transient failure, updates the row
//     to completed with the status, the [Config.StoredHeaders] of the
//     response and its body, commits, and only then sends the recorded
//     response, with all the headers the handler set;
//  4. if the status is a transient failure — 408, 409 (a concurrent update,
//     say), 425, 429 or 500 and above — rolls everything back (the key's row
//     and all the handler's work) and sends the recorded response
//     unchanged. It is not stored: the command had no effect, and the
//     client may retry it with the same key and have it run again.
//
// So the handler's effects and the stored response commit together, or
// neither does: there is no moment at which one exists without the other,
// and nothing is sent to the client before the commit. If the commit fails,
// nothing was applied and the client gets 500 ([ProblemNotRecorded]). If the
// handler panics, the transaction is rolled back and the panic goes on.
//
// Note that a 4xx response is stored and commits whatever the handler wrote
// before deciding to reject the request: handlers should validate before
// they write, or respond with a 5xx status to discard their work.
//
// When the key's row already exists, the transaction is rolled back and the
// row read:
//
//   - expired (expires_at at or before now): the key is treated as absent;
//     the old row is deleted and the request runs again from step 1, as a
//     first request;
//   - a different request digest: 409 Conflict, [ProblemKeyReused]
//     ("Idempotency-Key reused with a different request");
//   - the same digest: the stored response is replayed — its stored
//     headers, status and body, plus "Idempotent-Replayed: true"
//     ([HeaderReplayed]). The handler does not run.
//
// # Callers
//
// The application names who sent each request: [Config.Caller] returns an
// id that stays the same across the caller's retries and that only the
// caller can present. There is no default: [New] returns [ErrNoCaller]
// without one. Scoping by a credential that changes over a session (a
// bearer token, which is refreshed) would run a command twice when the
// token is refreshed between an attempt and its retry; scoping by nothing
// would share one user's keys, and responses, with every other user.
//
//   - Bearer tokens (OAuth 2, OpenID Connect, JWT): the verified token's
//     subject ("sub"), or its client id for a client-credentials token;
//     not the token.
//   - Session cookies: the session's user id, as the authentication
//     middleware in front of the ledger put it in the request's context;
//     not the cookie, and not the session id if sessions are rotated.
//   - Mutual TLS: the client certificate's subject,
//     r.TLS.PeerCertificates[0].Subject.String() (or its SAN), which stays
//     the same when the certificate is renewed.
//   - API keys: the key's id in your key store, which outlives a rotation
//     of the secret.
//
// A machine-to-machine API with a single client, or one that
// authenticates nobody, sets [Config.SingleCaller] instead: every request
// of a tenant shares its keys.
//
// # Concurrent repeats
//
// A repeat that arrives while the first request with its key is still
// running WAITS for it, up to [Config.LockTimeout], and then replays its
// response; if the first request fails with a 5xx or rolls back, the repeat
// runs the handler itself. A repeat that waited LockTimeout in vain gets 409
// Conflict, [ProblemInProgress] ("request with this Idempotency-Key still in
// progress"), and may retry later.
//
// On PostgreSQL the wait is on the key's unique index: the repeat's insert
// blocks until the first transaction ends (each ledger transaction sets a
// transaction-local lock_timeout of LockTimeout while it inserts, and puts
// the previous value back before the handler runs, so the handler's own
// statements are not bound by it). Repeats of different keys never wait for
// each other.
//
// On SQLite, which has one writer at a time, ledger transactions begin with
// BEGIN IMMEDIATE (open the database with embedded.OpenSQLite, which sets
// that up) on a connection whose busy timeout is LockTimeout
// for the duration of the transaction. A repeat therefore waits for the
// database's write lock, held by the first request until it commits; so
// does any other keyed request, whatever its key, and LockTimeout bounds
// that wait too.
//
// # Storage
//
// The ledger is the idempotency_keys table, created by [Migrate] (or from
// the files of [Migrations] with a migration tool of your own). Keys are
// remembered for [Config.TTL] from their first request; [Purge] deletes the
// expired ones and should run periodically. An expired key that has not
// been purged yet is already treated as absent.
//
// Responses are buffered in memory and stored whole, so keep the middleware
// to command endpoints with modest responses; a handler behind it cannot
// stream (the recorder implements neither http.Flusher nor http.Hijacker).
package idempotency

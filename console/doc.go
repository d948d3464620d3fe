// Package console is bento's web console for operators: an [http.Handler]
// that shows the outbox backlog and the dead letters and lets you requeue or
// discard them.
//
// It is server-rendered HTML (html/template) with one embedded stylesheet:
// no script, no CDN, nothing fetched from elsewhere, so it works on a closed
// network and under a strict Content-Security-Policy.
//
// # Pages
//
//   - Overview (/): rows by status, how many are pending and the age of the
//     oldest pending one, the backlog by topic and by tenant, and a chart of
//     events published and failed per minute over the last 60 minutes
//     (inline SVG, drawn on the server). A tenant filter narrows it all.
//   - Dead letters (/dead): the dead rows, oldest first, with tenant, topic,
//     aggregate, attempts, the last error and when it failed; filters by
//     tenant and topic; a Requeue button per row and per topic.
//   - A dead letter (/dead/{id}): every field, the full last error, the
//     Requeue and Discard buttons, and the payload and metadata only when
//     [Config].ShowPayloads is set.
//   - Scheduled (/scheduled): the scheduled messages still waiting to be
//     released, first due first, with tenant, topic, key, due and created
//     times, how many wait and when the first falls due (overdue when no
//     projector releases them); a tenant filter; a Cancel per key, which
//     asks for a confirmation box and cancels every message of the row's
//     tenant still waiting under the key.
//   - Processes (/processes), when [Config].ProcessTables names the state
//     tables of process managers (package process): each table's running
//     processes, started first first, with process type, tenant, key,
//     version, start and update times and live timeouts; a tenant filter;
//     an Abandon per process, which asks for a confirmation box and
//     completes the process without a step, cancelling its timeouts
//     (process.Abandon).
//
// # Mounting
//
// [New] returns a [*Console]; mount it under any prefix with
// [http.StripPrefix]. Every link, form and redirect it renders is relative,
// so nothing needs to know the prefix:
//
//	con, err := console.New(store, &console.Config{ReadOnly: true})
//	mux.Handle("/console/", http.StripPrefix("/console", con))
//
// The console has no login of its own: put it behind the authentication
// your other operator endpoints use, or serve it on an internal address
// (the bento CLI's "console --addr" does the latter).
//
// # Safety
//
// Every change is a POST form followed by a redirect (POST-redirect-GET)
// with a message saying what happened. A POST must carry a CSRF token that
// matches a SameSite=Strict cookie (HMAC-SHA256 under [Config].Secret), and
// cross-origin browser requests are refused by their Sec-Fetch-Site or
// Origin header; a refused POST gets 403 and a page saying why. With
// [Config].ReadOnly no button is rendered and every POST gets 403.
// Discarding, cancelling and abandoning ask for a confirmation box to be
// ticked.
//
// Every response carries Content-Security-Policy (default-src 'none', the
// console's own stylesheet, no script), X-Frame-Options: DENY,
// Referrer-Policy: same-origin, X-Content-Type-Options: nosniff and
// Cache-Control: no-store. Everything shown is escaped by html/template. An
// error of the store renders a 500 page with the error's message and is
// logged.
//
// It answers only to the names in [Config].AllowedHosts and, unless
// [Config].ExcludeLoopback is set, the loopback names, by the Host header
// alone (X-Forwarded-Host is never read); any other Host gets 421, which
// stops DNS rebinding. Behind a reverse proxy on the same machine, have the
// proxy pass the browser's Host on, list the console's public name and set
// ExcludeLoopback.
//
// [Config].Tenant locks the console to one tenant on every page and action:
// the outbox and its scheduled messages, the processes, the consumer
// groups' dead letters and the unroutable events.
// Lists show only that tenant's; a page or action for another tenant's id
// answers 404 and changes nothing.
package console

package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/consumer"
	"github.com/bentoevents/bento/internal/deadfixture"
	"github.com/bentoevents/bento/internal/testenv"
	"github.com/bentoevents/bento/outbox"
)

// These tests drive the console in a real headless Chromium. They skip when
// Chromium is not installed (and fail when CI is set); scripts/chromium.sh
// installs it. On failure each test saves a screenshot of the page into
// $BENTO_TEST_ARTIFACTS, or console/testdata/artifacts, and logs its path.

// chromiumPath returns the browser to drive: $BENTO_CHROMIUM, else
// /usr/bin/chromium, else chromium or google-chrome on PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BENTO_CHROMIUM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "Chromium not found (looked for $BENTO_CHROMIUM, /usr/bin/chromium and chromium on PATH); " +
		"install it with: bash scripts/chromium.sh (or apt-get install -y chromium)"
	if testenv.InCI() {
		t.Fatal(msg + " (CI is set, so this is a failure)")
	}
	t.Skip(msg)
	return ""
}

// browserSlots limits how many Chromiums run at once: each takes a few
// hundred MB and the test machines have two cores.
var browserSlots = make(chan struct{}, 1)

// browser starts a headless Chromium with a fresh profile and returns a tab
// context for it, ended at cleanup. When the test fails, the tab's page is
// saved as a screenshot first.
func browser(t *testing.T) context.Context {
	t.Helper()
	return browserWith(t)
}

// browserWith is browser with Chromium started with extra options.
func browserWith(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	exe := chromiumPath(t)
	browserSlots <- struct{}{}
	t.Cleanup(func() { <-browserSlots })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx, append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-proxy-server", true),
		chromedp.WindowSize(1280, 900),
	}, extra...)...)
	t.Cleanup(acancel)
	tab, tcancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(format string, args ...any) {
		t.Logf("chromedp: "+format, args...)
	}))
	t.Cleanup(tcancel)
	// Start the browser now, so a failure to start is reported as such.
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate("about:blank")), "start %s", exe)
	t.Cleanup(func() {
		if t.Failed() {
			screenshot(t, tab)
		}
	})
	return tab
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// screenshot saves the tab's whole page as a PNG in the artifacts directory
// and logs where.
func screenshot(t *testing.T, tab context.Context) {
	dir := os.Getenv("BENTO_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(tab, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	name := unsafeName.ReplaceAllString(t.Name(), "_") + "-" + time.Now().UTC().Format("20060102T150405") + ".png"
	path, _ := filepath.Abs(filepath.Join(dir, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Logf("screenshot: %v", err)
		return
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err == nil {
		t.Logf("page was %s", loc)
	}
	t.Logf("screenshot of the failed page: %s", path)
}

// step runs actions with a timeout, so a missing element fails the test
// instead of hanging it.
func step(t *testing.T, tab context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 20*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, actions...), what)
}

func text(t *testing.T, tab context.Context, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 20*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID(id)))
	require.NoError(t, err, "text of #%s", id)
	return strings.TrimSpace(s)
}

func eval[T any](t *testing.T, tab context.Context, js string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	require.NoError(t, err, js)
	return v
}

// browserBackends runs fn on PostgreSQL and SQLite, one after the other so
// that only one browser runs at a time.
func browserBackends(t *testing.T, fn func(t *testing.T, db *gorm.DB)) {
	t.Helper()
	var mu sync.Mutex
	testenv.ForEachBackend(t, func(t *testing.T, _ testenv.Backend, db *gorm.DB) {
		mu.Lock()
		defer mu.Unlock()
		fn(t, db)
	})
}

func TestBrowserOverviewShowsTheCounts(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		tab := browser(t)
		step(t, tab, "open the overview", chromedp.Navigate(e.url("/")), chromedp.WaitVisible(chromedp.ID("count-dead")))
		for status, want := range map[outbox.Status]string{
			outbox.StatusNew: "1", outbox.StatusPublishing: "0",
			outbox.StatusFailed: "1", outbox.StatusDead: "2",
		} {
			assert.Equal(t, want, text(t, tab, "count-"+string(status)), "count of %s", status)
		}
		assert.Zero(t, eval[int](t, tab, `document.querySelectorAll("#count-sent").length`), "sent rows are not counted")
		assert.Equal(t, "2", text(t, tab, "pending"))
		assert.Equal(t, "9m 58s", text(t, tab, "oldest-pending"))
		assert.Equal(t, "1", text(t, tab, "published-total"))
		assert.Equal(t, "3", text(t, tab, "failed-total"))

		// The stylesheet loaded under the prefix and applied (CSP allows it).
		assert.Equal(t, 1, eval[int](t, tab, `document.styleSheets.length`))
		assert.Equal(t, "flex", eval[string](t, tab, `getComputedStyle(document.querySelector(".cards")).display`))
		// The chart drew one bar for each non-empty series of a minute.
		assert.Equal(t, 60, eval[int](t, tab, `document.querySelectorAll("#chart .slot").length`))
		assert.Equal(t, 1, eval[int](t, tab, `document.querySelectorAll("#chart rect.published").length`))
		assert.Equal(t, 2, eval[int](t, tab, `document.querySelectorAll("#chart rect.failed").length`))

		// The tenant filter narrows the figures.
		step(t, tab, "filter on acme",
			chromedp.SetValue(chromedp.CSS(`select[name="tenant"]`), "acme"),
			chromedp.Submit(chromedp.CSS(`form.filter`)),
			chromedp.WaitVisible(chromedp.ID("tenant")),
		)
		assert.Equal(t, "acme", text(t, tab, "tenant"))
		assert.Equal(t, "1", text(t, tab, "count-dead"))
		assert.Equal(t, "0", text(t, tab, "count-new"))
	})
}

func TestBrowserRequeueByClickingTheButton(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		tab := browser(t)
		id := e.rows["b"].ID
		step(t, tab, "open the dead letters", chromedp.Navigate(e.url("/")), chromedp.Click(chromedp.CSS(`nav a[href="./dead"]`)),
			chromedp.WaitVisible(chromedp.ID("dead-letters")))
		assert.Equal(t, "2", text(t, tab, "dead-total"))
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"))

		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[data-action="requeue"][data-id=%q]`, id))))
		require.NoError(t, err, "click requeue")
		assert.EqualValues(t, 200, res.Status)
		assert.Contains(t, res.URL, e.url("/dead?done=requeued"), "redirected back to the list")

		assert.Contains(t, text(t, tab, "flash"), "Requeued 1 dead letter")
		assert.Equal(t, "1", text(t, tab, "dead-total"))
		assert.Equal(t, 0, eval[int](t, tab, fmt.Sprintf(`document.querySelectorAll('tr[data-id=%q]').length`, id)), "row gone from the list")
		assert.Equal(t, outbox.StatusNew, e.status(t, "b"), "the database row is back to new")
		assert.Equal(t, outbox.StatusDead, e.status(t, "e"), "the other dead letter is untouched")
	})
}

func TestBrowserDiscardAfterConfirming(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		tab := browser(t)
		id := e.rows["e"].ID
		step(t, tab, "open the dead letter", chromedp.Navigate(e.url("/dead")),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] a.discard-link`, id))),
			chromedp.WaitVisible(chromedp.ID("event-id")))
		assert.Equal(t, id, text(t, tab, "event-id"))

		// Without the box ticked the browser does not even send the form.
		step(t, tab, "click discard unconfirmed", chromedp.Click(chromedp.CSS(`button[data-action="discard"]`)))
		assert.False(t, eval[bool](t, tab, `document.querySelector("#discard").checkValidity()`))
		assert.Equal(t, outbox.StatusDead, e.status(t, "e"))

		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		_, err := chromedp.RunResponse(ctx,
			chromedp.Click(chromedp.CSS(`#discard input[name="confirm"]`)),
			chromedp.Click(chromedp.CSS(`button[data-action="discard"]`)))
		require.NoError(t, err)
		assert.Contains(t, text(t, tab, "flash"), "Discarded 1 dead letter")
		assert.Equal(t, outbox.Status(""), e.status(t, "e"), "deleted")
	})
}

// TestBrowserCancelScheduledAfterConfirming: from the nav to the
// scheduled messages, a Cancel is not sent until its box is ticked, and
// then cancels the row's key of its tenant only.
func TestBrowserCancelScheduledAfterConfirming(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		own := e.schedule(t, "acme", "invoice.remind", "invoice-7", time.Hour)
		other := e.schedule(t, "default", "invoice.remind", "invoice-7", 2*time.Hour)
		tab := browser(t)
		step(t, tab, "open the scheduled messages", chromedp.Navigate(e.url("/")), chromedp.Click(chromedp.CSS(`nav a[href="./scheduled"]`)),
			chromedp.WaitVisible(chromedp.ID("scheduled-messages")))
		assert.Equal(t, "2", text(t, tab, "scheduled-waiting"))

		row := fmt.Sprintf(`tr[data-id=%q]`, own.ID)
		step(t, tab, "click cancel unconfirmed", chromedp.Click(chromedp.CSS(row+` button[data-action="cancel"]`)))
		assert.False(t, eval[bool](t, tab, fmt.Sprintf(`document.querySelector(%q).checkValidity()`, row+" form")))
		assert.Len(t, e.waitingIDs(t), 2)

		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx,
			chromedp.Click(chromedp.CSS(row+` input[name="confirm"]`)),
			chromedp.Click(chromedp.CSS(row+` button[data-action="cancel"]`)))
		require.NoError(t, err)
		assert.EqualValues(t, 200, res.Status)
		assert.Contains(t, text(t, tab, "flash"), "Cancelled 1 scheduled message")
		assert.Equal(t, "1", text(t, tab, "scheduled-waiting"))
		assert.Equal(t, []string{other.ID}, e.waitingIDs(t), "the default tenant's message under the same key stays")
	})
}

// TestBrowserAbandonProcessAfterConfirming: from the nav to the
// processes, an Abandon is not sent until its box is ticked, and then
// abandons the row's process of its tenant only.
func TestBrowserAbandonProcessAfterConfirming(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, checkoutsConsole(console.Config{}))
		e.startCheckout(t, "acme", "o-1", 2*time.Hour, false, "payment")
		e.startCheckout(t, "default", "o-1", time.Hour, false)
		tab := browser(t)
		step(t, tab, "open the processes", chromedp.Navigate(e.url("/")), chromedp.Click(chromedp.CSS(`nav a[href="./processes"]`)),
			chromedp.WaitVisible(chromedp.ID("processes-running")))
		assert.Equal(t, "2", text(t, tab, "processes-running"))

		row := `tr[data-tenant="acme"][data-key="o-1"]`
		step(t, tab, "click abandon unconfirmed", chromedp.Click(chromedp.CSS(row+` button[data-action="abandon"]`)))
		assert.False(t, eval[bool](t, tab, fmt.Sprintf(`document.querySelector(%q).checkValidity()`, row+" form")))
		assert.Len(t, e.runningCheckouts(t), 2)

		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx,
			chromedp.Click(chromedp.CSS(row+` input[name="confirm"]`)),
			chromedp.Click(chromedp.CSS(row+` button[data-action="abandon"]`)))
		require.NoError(t, err)
		assert.EqualValues(t, 200, res.Status)
		assert.Contains(t, text(t, tab, "flash"), "Abandoned the process")
		assert.Equal(t, "1", text(t, tab, "processes-running"))
		assert.Equal(t, []string{"default/o-1"}, e.runningCheckouts(t), "the default tenant's process under the same key runs")
		assert.Empty(t, e.waitingIDs(t), "acme's timeout was cancelled")
	})
}

func TestBrowserForgedPostIsRefused(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		tab := browser(t)
		id := e.rows["b"].ID
		step(t, tab, "open the dead letters", chromedp.Navigate(e.url("/dead")), chromedp.WaitVisible(chromedp.ID("dead-letters")))

		// The console's CSP (connect-src falls back to default-src 'none')
		// stops even a same-origin script from posting with fetch.
		blocked := eval[string](t, tab, fmt.Sprintf(`fetch("dead/%s/requeue", {method: "POST"}).then(r => "sent " + r.status, e => "blocked")`, id))
		assert.Equal(t, "blocked", blocked)

		// With the CSP bypassed, as a script on another page of the same
		// origin could: the CSRF cookie goes along, but there is no token.
		step(t, tab, "bypass the CSP and reload",
			chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
				_, err := cdp.Call(ctx, tg, page.SetBypassCSP, page.SetBypassCSPParams{Enabled: true})
				return err
			}),
			chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("dead-letters")))
		status := eval[int](t, tab, fmt.Sprintf(`fetch("dead/%s/requeue", {method: "POST", credentials: "same-origin",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "x=1"}).then(r => r.status)`, id))
		assert.Equal(t, 403, status)
		// A wrong token is no better.
		status = eval[int](t, tab, fmt.Sprintf(`fetch("dead/%s/requeue", {method: "POST",
			headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "csrf_token=forged"}).then(r => r.status)`, id))
		assert.Equal(t, 403, status)
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"))
		// A form that lost its token, submitted by a click.
		step(t, tab, "strip the token and submit",
			chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('input[name="csrf_token"]').forEach(i => i.remove())`),
		)
		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`button[data-action="requeue"][data-id=%q]`, id))))
		require.NoError(t, err)
		assert.EqualValues(t, 403, res.Status)
		assert.Contains(t, text(t, tab, "error-message"), "CSRF token")
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"), "nothing changed")
	})
}

// TestBrowserDNSRebindingIsRefused: a page of another site whose name has
// been pointed at the console's address (DNS rebinding, played with
// Chromium's host resolver rules) gets nothing of the console: the console
// refuses the foreign Host with 421, so the attacker's same-origin requests
// never reach a page, a cookie or a form, where the CSRF defences would
// pass. The console by its own address works in the same browser.
func TestBrowserDNSRebindingIsRefused(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, nil)
		tab := browserWith(t, chromedp.Flag("host-resolver-rules", "MAP rebind.attacker.test 127.0.0.1"))
		port := strings.TrimPrefix(e.srv.URL, "http://127.0.0.1:")
		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx, chromedp.Navigate("http://rebind.attacker.test:"+port+e.prefix+"/dead"))
		require.NoError(t, err)
		assert.EqualValues(t, 421, res.Status)
		assert.Contains(t, eval[string](t, tab, `document.body.innerText`), "does not answer to the host")
		assert.Zero(t, eval[int](t, tab, `document.querySelectorAll("form").length`), "no form, no token")
		assert.Empty(t, eval[string](t, tab, `document.cookie`), "no CSRF cookie")

		res, err = chromedp.RunResponse(ctx, chromedp.Navigate(e.url("/dead")))
		require.NoError(t, err)
		assert.EqualValues(t, 200, res.Status)
		assert.Positive(t, eval[int](t, tab, `document.querySelectorAll("form").length`))
	})
}

func TestBrowserReadOnlyHasNoButtons(t *testing.T) {
	t.Parallel()
	browserBackends(t, func(t *testing.T, db *gorm.DB) {
		e := setup(t, db, &console.Config{ReadOnly: true})
		tab := browser(t)
		for _, path := range []string{"/", "/dead", "/dead/" + e.rows["b"].ID} {
			step(t, tab, "open "+path, chromedp.Navigate(e.url(path)), chromedp.WaitVisible(chromedp.ID("read-only")))
			assert.Equal(t, 0, eval[int](t, tab, `document.querySelectorAll("button, form[method=post], input[name=csrf_token]").length`), path)
		}
		assert.Equal(t, 1, eval[int](t, tab, `document.querySelectorAll("#event-id").length`), "the detail page itself is there")
		// A form posted anyway (built in the page, as a forger would) is
		// refused.
		ctx, cancel := context.WithTimeout(tab, 20*time.Second)
		defer cancel()
		res, err := chromedp.RunResponse(ctx, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
			const f = document.createElement("form");
			f.method = "post"; f.action = "%s/requeue";
			document.body.appendChild(f); f.submit();
		})()`, e.rows["b"].ID)))
		require.NoError(t, err)
		assert.EqualValues(t, 403, res.Status)
		assert.Contains(t, text(t, tab, "error-message"), "read-only")
		assert.Equal(t, outbox.StatusDead, e.status(t, "b"))
	})
}

// TestBrowserConsumerDeadLetters: a consumer group's handler fails for good
// on two events, which land in its dead letters, on RabbitMQ and on the
// database bus. In Chromium the operator
// finds the group and its dead letters with their cause, opens one (its
// error shown, its payload hidden), replays it after the fix, and it is
// applied exactly once; the other is discarded after ticking the
// confirmation, and is never applied.
func TestBrowserConsumerDeadLetters(t *testing.T) {
	t.Parallel()
	for _, bus := range []string{"rabbitmq", "database"} {
		t.Run(bus, func(t *testing.T) {
			t.Parallel()
			db, _ := testenv.Postgres(t)
			ctx := context.Background()
			var f *deadfixture.Fixture
			consumers := &console.Consumers{}
			if bus == "rabbitmq" {
				f = deadfixture.Start(t, db, testenv.NewExchange(t), "ui")
				consumers.AMQP = f.AMQP
			} else {
				f = deadfixture.StartDatabase(t, db, "ui")
				consumers.DeadLetters = f.Dead
			}
			group, ids := f.Group, f.IDs
			consumers.Groups = []string{group}
			require.Eventually(t, func() bool {
				dead, err := f.Dead.List(ctx, group, consumer.DeadFilter{}, 10)
				return err == nil && len(dead) == 2
			}, 30*time.Second, 100*time.Millisecond)

			e := setup(t, db, &console.Config{Consumers: consumers})
			tab := browser(t)
			step(t, tab, "open the consumer groups", chromedp.Navigate(e.url("/consumers")), chromedp.WaitVisible(chromedp.ID("consumer-groups")))
			assert.Equal(t, "2", eval[string](t, tab, fmt.Sprintf(`document.querySelector('tr[data-group=%q] td.num').textContent`, group)))
			step(t, tab, "open the group", chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-group=%q] a`, group))),
				chromedp.WaitVisible(chromedp.ID("group-dead-letters")))
			assert.Equal(t, "permanent", eval[string](t, tab, fmt.Sprintf(`document.querySelector('tr[data-id=%q] td[data-field=cause]').textContent`, ids[0])))
			step(t, tab, "open the first dead letter", chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] a`, ids[0]))),
				chromedp.WaitVisible(chromedp.ID("message-id")))
			assert.Contains(t, text(t, tab, "dead-error"), "unknown sku kiwi")
			assert.Contains(t, text(t, tab, "payload-hidden"), "hidden")
			assert.NotContains(t, eval[string](t, tab, `document.body.innerText`), `"sku"`, "no payload on the page")

			f.Fix()
			step(t, tab, "replay it", chromedp.Click(chromedp.CSS(`button[data-action="replay"]`)), chromedp.WaitVisible(chromedp.ID("flash")))
			assert.Contains(t, text(t, tab, "flash"), "Replayed 1")
			countApplied := func() int64 { return f.Applied(t) }
			require.Eventually(t, func() bool { return countApplied() == 1 }, 20*time.Second, 50*time.Millisecond, "the replay applied")

			step(t, tab, "open the other", chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id=%q] a`, ids[1]))),
				chromedp.WaitVisible(chromedp.ID("message-id")))
			step(t, tab, "discard it after confirming", chromedp.Click(chromedp.CSS(`#discard input[name="confirm"]`)),
				chromedp.Click(chromedp.CSS(`button[data-action="discard"]`)), chromedp.WaitVisible(chromedp.ID("flash")))
			assert.Contains(t, text(t, tab, "flash"), "Discarded 1")
			assert.Equal(t, "0", text(t, tab, "group-dead-total"))
			left, err := f.Dead.List(ctx, group, consumer.DeadFilter{}, 10)
			require.NoError(t, err)
			assert.Empty(t, left)
			time.Sleep(300 * time.Millisecond)
			assert.Equal(t, int64(1), countApplied(), "applied once; the discarded one never")
		})
	}
}

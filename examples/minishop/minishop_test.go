package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/internal/embeddb"
	"github.com/bentoevents/bento/internal/testenv"
)

// binary is the minishop executable, built once for the package's tests.
var binary string

func TestMain(m *testing.M) { os.Exit(testenv.RunWithBinary(m, "minishop", &binary)) }

// proc is a running minishop process.
type proc struct {
	cmd  *exec.Cmd
	url  string // base URL when it serves HTTP
	mu   sync.Mutex
	logs bytes.Buffer
	done chan error
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

var listenRE = regexp.MustCompile(`HTTP API listening" addr=(\S+)`)

// start runs minishop with env and args; for modes that serve HTTP it waits
// for the listening address. The process gets SIGTERM at cleanup and must
// exit cleanly.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	p.cmd.Stderr, p.cmd.Stdout = pw, pw
	require.NoError(t, p.cmd.Start())
	addr := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			p.mu.Lock()
			p.logs.WriteString(s.Text() + "\n")
			p.mu.Unlock()
			if m := listenRE.FindStringSubmatch(s.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	go func() { p.done <- p.cmd.Wait(); _ = pw.Close() }()
	serves := true
	for _, a := range args {
		if a == "relay" || a == "worker" || a == "migrate" {
			serves = false
		}
	}
	if serves {
		select {
		case a := <-addr:
			p.url = "http://" + a
		case err := <-p.done:
			t.Fatalf("minishop exited (%v):\n%s", err, p.log())
		case <-time.After(60 * time.Second):
			t.Fatalf("minishop did not listen:\n%s", p.log())
		}
	}
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop sends SIGTERM and expects a clean exit.
func (p *proc) stop(t *testing.T) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		assert.NoError(t, err, "minishop did not exit cleanly:\n%s", p.log())
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("minishop ignored SIGTERM:\n%s", p.log())
	}
}

// kill sends SIGKILL.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

func call(t *testing.T, method, url, body string, header map[string]string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return do(t, req)
}

// do sends req and reads the whole response.
func do(t *testing.T, req *http.Request) response {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// startEmbedded starts minishop on a fresh SQLite file and the database bus.
func startEmbedded(t *testing.T) *proc {
	t.Helper()
	p, _ := embeddedAt(t)
	return p
}

// embeddedAt is startEmbedded, also returning the SQLite file.
func embeddedAt(t *testing.T) (*proc, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "minishop.db")
	return start(t, []string{"DATABASE_URL=", "AMQP_URL="}, "-addr", "127.0.0.1:0", "-db", path), path
}

func reserved(t *testing.T, base, sku string) float64 {
	t.Helper()
	r := call(t, "GET", base+"/inventory/"+sku, "", nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	return r.json(t)["reserved"].(float64)
}

func notifications(t *testing.T, base, orderID string) []any {
	t.Helper()
	r := call(t, "GET", base+"/notifications?order_id="+orderID, "", nil)
	require.Equal(t, 200, r.status)
	var list []any
	require.NoError(t, json.Unmarshal(r.body, &list))
	return list
}

func TestHappyPathOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	first := strings.SplitN(p.log(), "\n", 2)[0]
	assert.Contains(t, first, "embedded SQLite", "the first log line names the database")
	assert.Contains(t, first, "the database bus", "and the bus: the database bus by default")

	r := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"apple","qty":2},{"sku":"coffee","qty":1}]}`, nil)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	placed := r.json(t)
	id := placed["id"].(string)
	assert.Equal(t, "placed", placed["status"])
	assert.Equal(t, "c1", placed["customer_id"])
	assert.Equal(t, 2*120.0+950, placed["total_cents"])
	assert.Equal(t, 1.0, placed["version"])
	items := placed["items"].([]any)
	require.Len(t, items, 2)
	assert.Equal(t, map[string]any{"sku": "apple", "qty": 2.0, "price_cents": 120.0}, items[0])

	got := call(t, "GET", p.url+"/orders/"+id, "", nil)
	require.Equal(t, 200, got.status)
	assert.Equal(t, placed, got.json(t))

	testenv.WaitFor(t, 10*time.Second, "stock reserved", func() bool { return reserved(t, p.url, "apple") == 2 })
	assert.Equal(t, 1.0, reserved(t, p.url, "coffee"))
	inv := call(t, "GET", p.url+"/inventory/apple", "", nil).json(t)
	assert.Equal(t, 1_000_000.0, inv["on_hand"])

	r = call(t, "POST", p.url+"/orders/"+id+"/pay", "", nil)
	require.Equal(t, 200, r.status, "%s", r.body)
	assert.Equal(t, "paid", r.json(t)["status"])
	testenv.WaitFor(t, 10*time.Second, "the notification", func() bool { return len(notifications(t, p.url, id)) == 1 })
	note := notifications(t, p.url, id)[0].(map[string]any)
	assert.Equal(t, "c1", note["customer_id"])
	assert.Equal(t, 2.0, reserved(t, p.url, "apple"), "a paid order keeps its reservation")

	other := call(t, "POST", p.url+"/orders", `{"customer_id":"c2","items":[{"sku":"apple","qty":5}]}`, nil).json(t)
	testenv.WaitFor(t, 10*time.Second, "the second reservation", func() bool { return reserved(t, p.url, "apple") == 7 })
	r = call(t, "POST", p.url+"/orders/"+other["id"].(string)+"/cancel", "", nil)
	require.Equal(t, 200, r.status)
	assert.Equal(t, "cancelled", r.json(t)["status"])
	testenv.WaitFor(t, 10*time.Second, "the release", func() bool { return reserved(t, p.url, "apple") == 2 })
	assert.Empty(t, notifications(t, p.url, other["id"].(string)), "no notification for an unpaid order")

	assert.Equal(t, 200, call(t, "GET", p.url+"/healthz", "", nil).status)
	// A consumer is ready once its first membership beat is in, which a
	// busy SQLite file can delay past the flow above.
	var ready response
	testenv.WaitFor(t, 30*time.Second, "/readyz to answer 200", func() bool {
		ready = call(t, "GET", p.url+"/readyz", "", nil)
		return ready.status == 200
	})
	var names []string
	for _, c := range ready.json(t)["checks"].([]any) {
		check := c.(map[string]any)
		names = append(names, check["name"].(string))
		assert.Equal(t, "ok", check["status"], "%v", check)
	}
	assert.Equal(t, []string{"database", "relay", "consumer inventory", "bus inventory", "consumer ordering", "bus ordering",
		"consumer notification", "bus notification", "consumer checkout", "bus checkout"}, names)
	metrics := call(t, "GET", p.url+"/metrics", "", nil)
	require.Equal(t, 200, metrics.status)
	assert.Contains(t, string(metrics.body), "bento_outbox_published_total")
	assert.Contains(t, string(metrics.body), "bento_inbox_processed_total")
	assert.Contains(t, string(metrics.body), "bento_consumer_handler_duration_seconds")
	assert.Contains(t, string(metrics.body), "bento_consumer_partitions_owned")
	assert.Contains(t, string(metrics.body), `bento_housekeeping_runs_total{result="ok",task="inbox-purge"} 1`,
		"housekeeping ran at start")
}

func TestErrorStatuses(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	check := func(name string, r response, status int) {
		t.Helper()
		assert.Equal(t, status, r.status, "%s: %s", name, r.body)
		assert.Equal(t, "application/problem+json", r.header.Get("Content-Type"), name)
		if r.status == status {
			assert.Equal(t, float64(status), r.json(t)["status"], name)
		}
	}
	check("malformed JSON", call(t, "POST", p.url+"/orders", `{"customer_id":`, nil), 400)
	check("empty items", call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[]}`, nil), 422)
	check("qty < 1", call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"tea","qty":0}]}`, nil), 422)
	check("unknown sku", call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"durian","qty":1}]}`, nil), 422)
	huge := `{"customer_id":"` + strings.Repeat("x", 1<<20) + `","items":[{"sku":"tea","qty":1}]}`
	check("body over the limit", call(t, "POST", p.url+"/orders", huge, nil), 413)
	check("pay unknown", call(t, "POST", p.url+"/orders/nope/pay", "", nil), 404)
	check("cancel unknown", call(t, "POST", p.url+"/orders/nope/cancel", "", nil), 404)
	check("get unknown", call(t, "GET", p.url+"/orders/nope", "", nil), 404)
	check("unknown sku stock", call(t, "GET", p.url+"/inventory/durian", "", nil), 404)

	id := call(t, "POST", p.url+"/orders", `{"customer_id":"c1","items":[{"sku":"tea","qty":1}]}`, nil).json(t)["id"].(string)
	require.Equal(t, 200, call(t, "POST", p.url+"/orders/"+id+"/pay", "", nil).status)
	check("pay twice", call(t, "POST", p.url+"/orders/"+id+"/pay", "", nil), 409)
	check("cancel paid", call(t, "POST", p.url+"/orders/"+id+"/cancel", "", nil), 409)
}

func TestIdempotencyKeys(t *testing.T) {
	t.Parallel()
	p, path := embeddedAt(t)
	body := `{"customer_id":"c9","items":[{"sku":"banana","qty":3}]}`
	key := map[string]string{"Idempotency-Key": "order-attempt-1"}
	first := call(t, "POST", p.url+"/orders", body, key)
	require.Equal(t, 201, first.status, "%s", first.body)
	again := call(t, "POST", p.url+"/orders", body, key)
	assert.Equal(t, 201, again.status)
	assert.Equal(t, string(first.body), string(again.body), "the stored response is replayed")
	assert.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	assert.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
	testenv.WaitFor(t, 10*time.Second, "the reservation", func() bool { return reserved(t, p.url, "banana") == 3 })

	conflict := call(t, "POST", p.url+"/orders", `{"customer_id":"c9","items":[{"sku":"banana","qty":4}]}`, key)
	assert.Equal(t, 409, conflict.status)
	assert.Equal(t, "application/problem+json", conflict.header.Get("Content-Type"))

	id := first.json(t)["id"].(string)
	payKey := map[string]string{"Idempotency-Key": "pay-" + id}
	require.Equal(t, 200, call(t, "POST", p.url+"/orders/"+id+"/pay", "", payKey).status)
	replay := call(t, "POST", p.url+"/orders/"+id+"/pay", "", payKey)
	assert.Equal(t, 200, replay.status, "a replayed payment is not a second payment: %s", replay.body)
	assert.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	testenv.WaitFor(t, 10*time.Second, "the notification", func() bool { return len(notifications(t, p.url, id)) == 1 })

	assert.Equal(t, 400, call(t, "POST", p.url+"/orders", body, map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}).status)
	assert.Equal(t, 400, call(t, "POST", p.url+"/orders", body, map[string]string{"Idempotency-Key": "caf\u00e9"}).status)
	db, err := embeddb.Open(path, nil)
	require.NoError(t, err)
	defer func() { sqlDB, _ := db.DB(); _ = sqlDB.Close() }()
	var orders, events int64
	require.NoError(t, db.Model(&order.Order{}).Where("customer_id = 'c9'").Count(&orders).Error)
	require.NoError(t, db.Table("outbox_events").Where("topic = 'order.paid'").Count(&events).Error)
	assert.Equal(t, int64(1), orders, "the replayed request did not place a second order")
	assert.Equal(t, int64(1), events, "the replayed payment did not pay twice")
	assert.Equal(t, 3.0, reserved(t, p.url, "banana"))
}

// TestServerBoundsHeaders: minishop's HTTP server refuses a request whose
// headers exceed its limit instead of reading them all.
func TestServerBoundsHeaders(t *testing.T) {
	t.Parallel()
	p := startEmbedded(t)
	big := call(t, "GET", p.url+"/healthz", "", map[string]string{"X-Padding": strings.Repeat("x", 200<<10)})
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, big.status)
	assert.Equal(t, 200, call(t, "GET", p.url+"/healthz", "", nil).status)
}

func TestSubcommandsAndFlags(t *testing.T) {
	t.Parallel()
	exitCode := func(env []string, args ...string) (int, string) {
		cmd := exec.Command(binary, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		require.NoError(t, err, "%s", out)
		return 0, string(out)
	}
	code, out := exitCode(nil, "frobnicate")
	assert.Equal(t, 2, code, out)
	code, out = exitCode(nil, "-lease", "-1s", "relay")
	assert.Equal(t, 2, code, out)
	assert.Contains(t, out, "-lease -1s is negative")
	code, out = exitCode([]string{"DATABASE_URL=", "AMQP_URL="}, "-db", filepath.Join(t.TempDir(), "m.db"), "migrate")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "migrated")
	code, out = exitCode(nil, "-no-such-flag")
	assert.Equal(t, 2, code, out)
}

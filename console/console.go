package console

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/outbox"
	"github.com/bentoevents/bento/process"
	"github.com/bentoevents/bento/rabbitmq"
	"github.com/bentoevents/bento/tenant"
)

// Defaults.
const (
	// DefaultDeadLimit is how many dead letters one page lists.
	DefaultDeadLimit = 100
	// DefaultTitle is the title shown on every page.
	DefaultTitle = "bento console"
	// ChartMinutes is how many minutes of activity the overview charts.
	ChartMinutes = 60
)

// ErrInvalidConfig is returned by New for a bad configuration; the message
// names every bad field.
var ErrInvalidConfig = errors.New("console: invalid config")

// Config configures a [Console]. A nil *Config or a zero field means the
// field's default: read-write, payloads hidden, all tenants, a random CSRF
// secret. Impossible values are rejected with [ErrInvalidConfig] naming the
// field.
type Config struct {
	// ReadOnly renders no buttons and refuses every POST with 403.
	// Defaults to false.
	ReadOnly bool
	// ShowPayloads shows the payload and metadata of a dead letter on its
	// detail page. They may hold personal data or secrets, so they are
	// hidden unless this is set. Defaults to false.
	ShowPayloads bool
	// Tenant, when set, restricts the console to one tenant on every page
	// and action: it lists only that tenant's outbox rows, scheduled
	// messages, processes, consumer dead letters and unroutable events (by
	// their tenant_id header), answers 404 for another tenant's id, and can
	// only requeue, replay, discard, cancel or abandon that tenant's.
	// Defaults to all tenants.
	Tenant string
	// Title is the name shown in the header and the page titles. Defaults
	// to DefaultTitle ("bento console").
	Title string
	// DeadLimit is how many dead letters the list shows at most (oldest
	// first), how many scheduled messages (first due first), and how many
	// processes of each of ProcessTables (started first first). Defaults
	// to DefaultDeadLimit (100).
	DeadLimit int
	// Refresh, when set, makes the overview page reload itself at that
	// interval, at least a second (an HTML meta refresh; the console runs
	// no script). Defaults to no reload.
	Refresh time.Duration
	// Secret keys the CSRF tokens (HMAC-SHA256); at least 32 bytes. Set the
	// same secret on every replica behind a load balancer, or tokens issued
	// by one are refused by the others. Defaults to 32 random bytes, made
	// when New is called.
	Secret []byte
	// AllowedHosts are the names the console answers to in a request's
	// Host header: a name ("console.internal", any port) or a name and port
	// ("console.internal:8080"); "*" allows any. Any other Host gets 421,
	// so that a page on another site cannot reach the console through DNS
	// rebinding (its name pointed at the console's address), where the
	// request is same-origin and the CSRF defences pass. The loopback names
	// localhost, 127.0.0.1 and ::1 are allowed too unless ExcludeLoopback
	// is set. Add the names operators use to reach the console (the bento
	// console command adds the host of its --addr). Only the Host header
	// counts: X-Forwarded-Host and Forwarded are never read. Defaults to
	// the loopback names only.
	AllowedHosts []string
	// ExcludeLoopback stops the loopback names being allowed in the Host
	// header unless AllowedHosts lists them. Set it behind a reverse proxy
	// that reaches the console on a loopback address: a proxy that rewrites
	// Host to its upstream (nginx's default, proxy_set_header Host
	// $proxy_host) would otherwise make every request, whatever name the
	// browser asked for, look like one for the console. Have the proxy pass
	// the browser's Host on and list the public name in AllowedHosts.
	// Requires AllowedHosts. Defaults to false: loopback names allowed, for
	// a console bound to a loopback address and reached on it.
	ExcludeLoopback bool
	// Consumers, when set, adds pages for the dead letters of consumer
	// groups on RabbitMQ or the database bus, with Replay and Discard, for the events they
	// parked behind a dead letter or a version gap, with Release, and for
	// their members and partitions. Defaults to none.
	Consumers *Consumers
	// Unroutable, when set, adds a page for the events parked in the
	// unroutable queue of this broker's exchange (published while no queue
	// was bound for their type), with a Replay per event type. Defaults to
	// none.
	Unroutable *rabbitmq.Config
	// UnroutableDB, when set, adds the same page for the database bus
	// (package dbbus) whose tables are in this database: the messages it
	// keeps in dbbus.UnroutableGroup because no group was bound to their
	// topic, by event type with their counts and ages, with a Replay per
	// event type that delivers each to every group bound to its topic now
	// and takes it out of the unroutable group in one transaction
	// (dbbus.ReplayUnroutable). Set Unroutable or UnroutableDB, not both.
	// Defaults to none.
	UnroutableDB *gorm.DB
	// ProcessTables names the state tables of process managers (package
	// process: GORM models embedding process.Base), in the store's
	// database, whose running processes the Processes page lists, with an
	// Abandon action (process.Abandon) for each. Each must be a plain SQL
	// identifier (process.ValidateTable). Defaults to none: the page and
	// its nav link are absent.
	ProcessTables []string
	// Logger receives a record of every requeue, discard, cancel and
	// abandon and of the errors shown as 500 pages. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Copy returns a copy of c.
func (c *Config) Copy() *Config {
	cp := *c
	cp.Secret = append([]byte(nil), c.Secret...)
	cp.AllowedHosts = slices.Clone(c.AllowedHosts)
	cp.ProcessTables = slices.Clone(c.ProcessTables)
	if c.Consumers != nil {
		cs := *c.Consumers
		cs.Groups = slices.Clone(cs.Groups)
		cs.Inspect = maps.Clone(cs.Inspect)
		cp.Consumers = &cs
	}
	return &cp
}

func (c *Config) withDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c.Copy()
	}
	var errs []error
	if out.Tenant != "" {
		if err := tenant.Validate(out.Tenant); err != nil {
			errs = append(errs, fmt.Errorf("Tenant: %w", err))
		}
	}
	if out.DeadLimit < 0 {
		errs = append(errs, fmt.Errorf("DeadLimit: %d is negative", out.DeadLimit))
	}
	if out.DeadLimit == 0 {
		out.DeadLimit = DefaultDeadLimit
	}
	if out.Refresh < 0 {
		errs = append(errs, fmt.Errorf("Refresh: %v is negative", out.Refresh))
	}
	if out.Refresh > 0 && out.Refresh < time.Second {
		errs = append(errs, fmt.Errorf("Refresh: %v is under a second", out.Refresh))
	}
	if out.Title == "" {
		out.Title = DefaultTitle
	}
	if len(out.Secret) == 0 {
		out.Secret = make([]byte, 32)
		if _, err := rand.Read(out.Secret); err != nil {
			errs = append(errs, fmt.Errorf("Secret: %w", err))
		}
	} else if len(out.Secret) < 32 {
		errs = append(errs, fmt.Errorf("Secret: %d bytes, want at least 32", len(out.Secret)))
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if cs := out.Consumers; cs != nil && ((cs.AMQP == nil && cs.DeadLetters == nil) || len(cs.Groups) == 0) {
		errs = append(errs, errors.New("Consumers: Groups, and AMQP or DeadLetters, are required"))
	}
	if out.Unroutable != nil && out.UnroutableDB != nil {
		errs = append(errs, errors.New("UnroutableDB: set with Unroutable; the unroutable page shows one bus"))
	}
	for i, table := range out.ProcessTables {
		if err := process.ValidateTable(table); err != nil {
			errs = append(errs, fmt.Errorf("ProcessTables[%d]: %w", i, err))
		}
	}
	if out.ExcludeLoopback && len(out.AllowedHosts) == 0 {
		errs = append(errs, errors.New("ExcludeLoopback: set without AllowedHosts, the console would answer to no host"))
	}
	for i, h := range out.AllowedHosts {
		if h == "" || strings.ContainsAny(h, "/ \t") {
			errs = append(errs, fmt.Errorf("AllowedHosts[%d]: %q is not a host name or host:port", i, h))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return out, nil
}

// Console is the web console: an [http.Handler] serving the overview, the
// dead letters and their actions. It is safe for concurrent use.
type Console struct {
	// data is the only way to the outbox and the broker: it narrows them
	// to cfg.Tenant.
	data   scope
	cfg    Config
	routes []route
	mux    *http.ServeMux
	xorig  *http.CrossOriginProtection
}

// route is one pattern of the console's mux and its handler.
type route struct {
	pattern string
	handler http.HandlerFunc
}

// New returns a console over store. cfg may be nil for the defaults.
// Mount it under a prefix with [http.StripPrefix]:
//
//	mux.Handle("/console/", http.StripPrefix("/console", c))
//
// Errors: ErrInvalidConfig naming each bad field.
func New(store *outbox.Store, cfg *Config) (*Console, error) {
	if store == nil {
		return nil, errors.New("console: nil store")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	con := &Console{
		data: scope{tenant: c.Tenant, store: store, consumers: c.Consumers, unroutable: c.Unroutable, unroutableDB: c.UnroutableDB},
		cfg:  c, mux: http.NewServeMux(), xorig: http.NewCrossOriginProtection(),
	}
	con.routes = con.routeTable()
	for _, rt := range con.routes {
		con.mux.HandleFunc(rt.pattern, rt.handler)
	}
	return con, nil
}

// Config returns the console's configuration with defaults filled in.
func (c *Console) Config() Config { return *c.cfg.Copy() }

// routeTable lists every page and action of the console. Each reaches the
// outbox and the broker through c.data only, which keeps it to the
// console's tenant.
func (c *Console) routeTable() []route {
	return []route{
		{"GET /{$}", c.overview},
		{"GET /dead", c.deadList},
		{"GET /dead/{id}", c.deadDetail},
		{"POST /dead/{id}/requeue", c.mutation(c.requeueOne)},
		{"POST /dead/{id}/discard", c.mutation(c.discardOne)},
		{"POST /dead/requeue", c.mutation(c.requeueTopic)},
		{"GET /scheduled", c.scheduledList},
		{"POST /scheduled/cancel", c.mutation(c.scheduledCancel)},
		{"GET /processes", c.processesList},
		{"POST /processes/abandon", c.mutation(c.processAbandon)},
		{"GET /consumers", c.consumerGroups},
		{"GET /consumers/{group}", c.groupDead},
		{"GET /consumers/{group}/{id}", c.groupDeadDetail},
		{"POST /consumers/{group}/{id}/replay", c.mutation(c.groupDeadAct("replay"))},
		{"POST /consumers/{group}/{id}/discard", c.mutation(c.groupDeadAct("discard"))},
		{"GET /consumers/{group}/parked", c.groupParked},
		{"GET /consumers/{group}/parked/aggregate", c.groupParkedAggregate},
		{"POST /consumers/{group}/parked/release", c.mutation(c.groupParkedRelease)},
		{"GET /consumers/{group}/members", c.groupMembers},
		{"GET /unroutable", c.unroutableList},
		{"POST /unroutable/replay", c.mutation(c.unroutableReplay)},
		{"GET /static/", c.static},
		{"/", c.notFound},
	}
}

// ServeHTTP serves the console. Paths are relative to where the console is
// mounted; every link it renders is relative too, so it works under any
// prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !c.hostAllowed(r.Host) {
		c.cfg.Logger.Warn("console: request for a host not allowed refused", "host", r.Host, "remote", r.RemoteAddr)
		// Plain text: nothing of the console, not even a CSRF cookie.
		http.Error(w, fmt.Sprintf("This console does not answer to the host %q. If that is how operators reach it, "+
			"add it to console.Config.AllowedHosts.", r.Host), http.StatusMisdirectedRequest)
		return
	}
	if r.URL.Path == "" {
		// Mounted at /console and asked for /console: send the browser to
		// /console/ so relative links resolve under the prefix.
		seg := lastSegment(requestPath(r))
		if seg == "" {
			seg = "."
		}
		redirect(w, seg+"/")
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/") {
		c.notFound(w, r)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// loopbackHosts are allowed in the Host header unless
// Config.ExcludeLoopback is set.
var loopbackHosts = []string{"localhost", "127.0.0.1", "::1"}

// hostAllowed reports whether host, a request's Host header, names the
// console (see Config.AllowedHosts).
func (c *Console) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.ToLower(strings.TrimSuffix(strings.Trim(name, "[]"), "."))
	if !c.cfg.ExcludeLoopback && slices.Contains(loopbackHosts, name) {
		return true
	}
	for _, a := range c.cfg.AllowedHosts {
		a = strings.ToLower(a)
		if a == "*" || a == name || a == strings.ToLower(host) {
			return true
		}
	}
	return false
}

// contentSecurityPolicy allows the console's own stylesheet and nothing
// else: no script at all, no inline styles, forms posting only to itself.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// redirect answers 303 See Other with a relative Location, which the
// browser resolves against the request URL (http.Redirect would resolve it
// against r.URL.Path, which lacks the mount prefix).
func redirect(w http.ResponseWriter, location string) {
	w.Header().Set("Location", location)
	w.WriteHeader(http.StatusSeeOther)
}

// requestPath returns the escaped path the client asked for, before any
// prefix was stripped.
func requestPath(r *http.Request) string {
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil && u.EscapedPath() != "" {
		return u.EscapedPath()
	}
	return r.URL.EscapedPath()
}

// mountPrefix returns the escaped path prefix the console is mounted under
// ("" at the root), derived from the request URI and the stripped path.
func mountPrefix(r *http.Request) string {
	orig, stripped := requestPath(r), r.URL.EscapedPath()
	if strings.HasSuffix(orig, stripped) {
		return strings.TrimSuffix(orig, stripped)
	}
	return ""
}

func lastSegment(p string) string {
	p = strings.TrimSuffix(p, "/")
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// relBase returns the relative path from the page at the (stripped) path p
// back to the console's root: "./" for "/" and "/dead", "../" for
// "/dead/ID".
func relBase(p string) string {
	depth := strings.Count(strings.TrimPrefix(p, "/"), "/")
	if depth == 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

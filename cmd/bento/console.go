package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/rabbitmq"
)

// console serves the web console until ctx is done (SIGINT or SIGTERM).
func (c *cli) console(ctx context.Context, args []string) error {
	fs := c.newFlags("console", "[--addr 127.0.0.1:8081] [--host NAME]... [--exclude-loopback] [--read-only] [--show-payloads] [--tenant T] [--refresh 10s] [--group G]... [--unroutable] [--bus B] [--exchange E] [--process-table T]...")
	addr := fs.String("addr", "127.0.0.1:8081", "listen address; the console has no login, so keep it internal")
	readOnly := fs.Bool("read-only", false, "no requeue or discard buttons; every POST is refused")
	payloads := fs.Bool("show-payloads", false, "show dead letters' payloads and metadata")
	tenant := fs.String("tenant", "", "only this tenant")
	refresh := fs.Duration("refresh", 0, "reload the overview at this interval (0: never)")
	var hosts stringsFlag
	fs.Var(&hosts, "host", "a `NAME` operators reach the console by, besides the loopback names and --addr's host (repeatable)")
	noLoopback := fs.Bool("exclude-loopback", false, "refuse the loopback names as Host: behind a reverse proxy on this machine, which must pass the browser's Host on")
	var groups stringsFlag
	fs.Var(&groups, "group", "a consumer `GROUP` to show: its dead letters (on the bus --bus chooses), parked events and members (repeatable)")
	unroutable := fs.Bool("unroutable", false, "show the unroutable events (on the bus --bus chooses), with a replay per event type")
	var processTables stringsFlag
	fs.Var(&processTables, "process-table", "a process manager's state `TABLE` whose running processes the Processes page lists, with an Abandon each (repeatable)")
	bus := addBusFlag(fs)
	exchange := fs.String("exchange", rabbitmq.DefaultExchange, "the groups' event exchange (or BENTO_EXCHANGE), with --group or --unroutable on RabbitMQ")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *refresh < 0 {
		return usagef("--refresh must not be negative")
	}
	if *noLoopback && len(hosts) == 0 {
		return usagef("--exclude-loopback needs a --host: the name the reverse proxy passes on as Host")
	}
	st, done, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer done()
	cfg := &console.Config{ReadOnly: *readOnly, ShowPayloads: *payloads, Tenant: *tenant, Refresh: *refresh,
		AllowedHosts: hosts, ExcludeLoopback: *noLoopback, ProcessTables: processTables}
	if host, _, err := net.SplitHostPort(*addr); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() &&
		!(*noLoopback && isLoopback(host)) {
		cfg.AllowedHosts = append(cfg.AllowedHosts, host)
	}
	if len(groups) > 0 {
		which, err := c.resolveBus(*bus)
		if err != nil {
			return err
		}
		cfg.Consumers = &console.Consumers{Groups: groups}
		if which == busRabbitMQ {
			if cfg.Consumers.AMQP, err = c.amqpConfig(fs, *exchange); err != nil {
				return err
			}
		} else if cfg.Consumers.DeadLetters, err = databaseDeadLetters(st.DB()); err != nil {
			return err
		}
	}
	if *unroutable {
		which, err := c.resolveBus(*bus)
		if err != nil {
			return err
		}
		if which == busRabbitMQ {
			if cfg.Unroutable, err = c.amqpConfig(fs, *exchange); err != nil {
				return err
			}
		} else {
			if _, err := databaseDeadLetters(st.DB()); err != nil {
				return err
			}
			cfg.UnroutableDB = st.DB()
		}
	}
	if secret := c.getenv("BENTO_CONSOLE_SECRET"); secret != "" {
		cfg.Secret = []byte(secret) // shared by replicas behind one load balancer
	}
	con, err := console.New(st, cfg)
	if err != nil {
		return usagef("%v", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return usagef("listen on %s: %v", *addr, err)
	}
	if host, _, _ := net.SplitHostPort(*addr); !isLoopback(host) {
		fmt.Fprintf(c.stderr, "bento console: warning: listening on %s; the console has no login of its own\n", *addr)
	}
	srv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stdout, "bento console: serving on http://%s/\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(c.stdout, "bento console: stopped")
	return nil
}

// isLoopback reports whether host is a loopback name or address.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (f *stringsFlag) String() string { return fmt.Sprint([]string(*f)) }

func (f *stringsFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

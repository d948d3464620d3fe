package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/console"
	"github.com/bentoevents/bento/examples/minishop/inventory"
	"github.com/bentoevents/bento/examples/minishop/order"
	"github.com/bentoevents/bento/health"
	"github.com/bentoevents/bento/idempotency"
	"github.com/bentoevents/bento/uow"
)

// handler returns minishop's HTTP API.
//
// POST /orders takes one JSON object, {"customer_id":"c1","items":[{"sku":
// "apple","qty":2}]}, sent as application/json (415 otherwise) in at most
// maxBody bytes (413). A body that is not exactly that (invalid UTF-8, a
// syntax error, data after the object, a member given twice, an unknown
// member, a value of the wrong type) gets 400; a well-formed order the shop
// refuses gets 422: a customer id that is not 1 to 64 bytes of printable
// UTF-8, no items or more than 100, a quantity outside 1..1000, an unknown
// sku. Errors are RFC 9457 problem+json; bad input never gets a 5xx.
//
// POST /orders/{id}/pay takes an optional body, {"card":"..."}, read as
// strictly. The test card DeclinedCard (4000-0000-0000-0002) is always
// declined: 402, order.payment_failed is recorded, the customer is told,
// and the order stays placed, payable with another card. An order the shop
// cancelled (its stock ran out, see cancel_reason) gets 409.
//
// Every POST honours Idempotency-Key:
// its unit of work joins the ledger's transaction, so the state change and
// the stored response commit together. minishop authenticates nobody, so
// the ledger has a single caller: every client shares the keys. The operator console (package
// console) is mounted at /console/, read-write with payloads hidden; a real
// deployment would put it behind its operators' authentication.
func (a *App) handler() (http.Handler, error) {
	// minishop authenticates nobody, so it has one caller and its clients
	// share their keys: a real shop authenticates its clients and names
	// the caller (Config.Caller) by the user's or client's id instead.
	ledger, err := idempotency.New(a.db, &idempotency.Config{MaxBodyBytes: maxBody, Logger: a.log, SingleCaller: true})
	if err != nil {
		return nil, err
	}
	// The Processes page lists the running checkouts (the Checkout model's
	// table) and can abandon one stuck waiting for a payment.
	ccfg := &console.Config{Title: "minishop outbox", Logger: a.log, ProcessTables: []string{checkoutTable}}
	if a.bus.amqp != nil { // consumer dead letters and unroutable events live on RabbitMQ
		ccfg.Consumers = &console.Consumers{AMQP: a.bus.amqp, Groups: []string{inventoryGroup, orderingGroup, notificationGroup}}
		ccfg.Unroutable = a.bus.amqp
	}
	con, err := console.New(a.units.Outbox(), ccfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	post := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, ledger.Middleware(h)) }
	post("POST /orders", a.postOrder)
	post("POST /orders/{id}/pay", a.postPay)
	post("POST /orders/{id}/cancel", a.postCancel)
	mux.HandleFunc("GET /orders/{id}", a.getOrder)
	mux.HandleFunc("GET /inventory/{sku}", a.getInventory)
	mux.HandleFunc("GET /notifications", a.getNotifications)
	mux.Handle("GET /healthz", health.Live())
	mux.Handle("GET /readyz", health.Ready(nil, a.readyChecks()...))
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{}))
	mux.Handle("/console/", http.StripPrefix("/console", con))
	return mux, nil
}

// itemJSON is an order line as the API shows it; requests give sku and qty
// only (orderLineJSON).
type itemJSON struct {
	SKU        string `json:"sku"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

// orderLineJSON is an order line as a request gives it.
type orderLineJSON struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type orderJSON struct {
	ID         string     `json:"id"`
	Status     string     `json:"status"`
	CustomerID string     `json:"customer_id"`
	Items      []itemJSON `json:"items"`
	TotalCents int64      `json:"total_cents"`
	Version    int64      `json:"version"`
	// CancelReason says why the shop cancelled the order.
	CancelReason string `json:"cancel_reason,omitempty"`
	// PaymentDueAt is when the checkout process cancels the order unless
	// it is paid: set on GET while the payment window is open.
	PaymentDueAt *time.Time `json:"payment_due_at,omitempty"`
}

func viewOrder(o *order.Order) orderJSON {
	v := orderJSON{ID: o.ID, Status: o.Status, CustomerID: o.CustomerID, TotalCents: o.TotalCents, Version: o.Version,
		CancelReason: o.CancelReason}
	for _, it := range o.Items {
		v.Items = append(v.Items, itemJSON{SKU: it.SKU, Qty: it.Qty, PriceCents: it.PriceCents})
	}
	return v
}

func (a *App) postOrder(w http.ResponseWriter, r *http.Request) {
	var req struct {
		CustomerID string          `json:"customer_id"`
		Items      []orderLineJSON `json:"items"`
	}
	if bad := decodeJSON(w, r, &req); bad != nil {
		problem(w, bad.status, bad.title, bad.detail)
		return
	}
	items := make([]order.Item, len(req.Items))
	for i, it := range req.Items {
		items[i] = order.Item{SKU: it.SKU, Qty: it.Qty}
	}
	o, err := a.PlaceOrder(r.Context(), req.CustomerID, items)
	if err != nil {
		a.commandError(w, err)
		return
	}
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, viewOrder(o))
}

// postPay pays an order. The body is optional: {"card":"..."}, where
// DeclinedCard is always declined (402, and the order stays payable).
func (a *App) postPay(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Card string `json:"card"`
	}
	if r.ContentLength != 0 {
		if bad := decodeJSON(w, r, &req); bad != nil {
			problem(w, bad.status, bad.title, bad.detail)
			return
		}
	}
	o, err := a.PayOrderWith(r.Context(), r.PathValue("id"), req.Card)
	if errors.Is(err, ErrPaymentDeclined) {
		problem(w, http.StatusPaymentRequired, "Payment declined",
			"the card was declined; the order is still placed and can be paid with another card")
		return
	}
	if err != nil {
		a.commandError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOrder(o))
}

func (a *App) postCancel(w http.ResponseWriter, r *http.Request) {
	o, err := a.CancelOrder(r.Context(), r.PathValue("id"))
	if err != nil {
		a.commandError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOrder(o))
}

// commandError maps a command's error to its problem response.
func (a *App) commandError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, order.ErrNoItems), errors.Is(err, order.ErrTooManyItems), errors.Is(err, order.ErrBadQuantity),
		errors.Is(err, order.ErrUnknownSKU), errors.Is(err, order.ErrNoCustomer), errors.Is(err, order.ErrBadCustomer),
		errors.Is(err, order.ErrOverflow):
		problem(w, http.StatusUnprocessableEntity, "Invalid order", err.Error())
	case errors.Is(err, uow.ErrPayloadTooLarge), errors.Is(err, uow.ErrMetadataTooLarge):
		// The body limit keeps every accepted order's event under the
		// outbox's limits; should one still be over, retrying cannot help.
		problem(w, http.StatusRequestEntityTooLarge, "Order too large", err.Error())
	case errors.Is(err, uow.ErrInvalidEvent):
		problem(w, http.StatusUnprocessableEntity, "Invalid order", err.Error())
	case errors.Is(err, uow.ErrNotFound):
		problem(w, http.StatusNotFound, "Order not found", err.Error())
	case errors.Is(err, order.ErrNotPayable), errors.Is(err, order.ErrNotCancelable):
		problem(w, http.StatusConflict, "Order is not in a state that allows this", err.Error())
	case errors.Is(err, uow.ErrConcurrencyConflict):
		problem(w, http.StatusConflict, "Concurrent change", err.Error())
	default:
		a.log.Error("command failed", "err", err)
		problem(w, http.StatusInternalServerError, "Internal error", "the command was not applied; retry it")
	}
}

func (a *App) getOrder(w http.ResponseWriter, r *http.Request) {
	var o order.Order
	err := a.db.WithContext(r.Context()).Take(&o, "id = ?", r.PathValue("id")).Error
	if err != nil {
		a.queryError(w, err, "Order not found")
		return
	}
	v := viewOrder(&o)
	due, open, err := a.paymentDeadline(r.Context(), o.ID)
	if err != nil {
		a.queryError(w, err, "Order not found")
		return
	}
	if open && o.Status == order.StatusPlaced {
		due = due.UTC()
		v.PaymentDueAt = &due
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *App) getInventory(w http.ResponseWriter, r *http.Request) {
	var s inventory.Stock
	if err := a.db.WithContext(r.Context()).Take(&s, "id = ?", r.PathValue("sku")).Error; err != nil {
		a.queryError(w, err, "Unknown sku")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sku": s.ID, "on_hand": s.OnHand, "reserved": s.Reserved})
}

func (a *App) getNotifications(w http.ResponseWriter, r *http.Request) {
	q := a.db.WithContext(r.Context()).Order("created_at, event_id").Limit(1000)
	if id := r.URL.Query().Get("order_id"); id != "" {
		q = q.Where("order_id = ?", id)
	}
	notes := []Notification{}
	if err := q.Find(&notes).Error; err != nil {
		a.queryError(w, err, "")
		return
	}
	writeJSON(w, http.StatusOK, notes)
}

func (a *App) queryError(w http.ResponseWriter, err error, notFound string) {
	if notFound != "" && errors.Is(err, gorm.ErrRecordNotFound) {
		problem(w, http.StatusNotFound, notFound, "")
		return
	}
	a.log.Error("query failed", "err", err)
	problem(w, http.StatusInternalServerError, "Internal error", "")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// problem writes an RFC 9457 problem+json response.
func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	body := map[string]any{"type": "about:blank", "title": title, "status": status}
	if detail != "" {
		body["detail"] = detail
	}
	_ = json.NewEncoder(w).Encode(body)
}

// readyMaxLag is how long the oldest event may wait for the relay before
// /readyz fails.
const readyMaxLag = time.Minute

// readyMaxBacklog is how many events may wait for a consumer group on the
// database bus before /readyz fails.
const readyMaxBacklog = 10000

// unroutableRetention is how long the database bus keeps the events no
// group consumes (stock.reserved, stock.released) before housekeeping
// deletes them.
const unroutableRetention = 24 * time.Hour

// readyChecks are what /readyz checks: the database, the relay's lag, the
// broker (on RabbitMQ) and the consumers this process runs, with their
// backlog on the database bus.
func (a *App) readyChecks() []health.Check {
	checks := []health.Check{health.Database(a.db), health.Relay(a.units.Outbox(), readyMaxLag)}
	if a.bus.amqp != nil {
		checks = append(checks, health.Broker(a.bus.amqp))
	}
	for _, c := range a.consumers {
		checks = append(checks, health.Consumer(c))
		if a.bus.amqp == nil {
			checks = append(checks, health.DatabaseBus(a.db, c.Group(), readyMaxBacklog))
		}
	}
	return checks
}

// Limits of minishop's HTTP server: a client that sends its headers or
// body too slowly, or keeps an idle connection, is cut off, and headers
// are bounded.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 15 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 64 << 10
)

// newServer returns minishop's HTTP server for h, with its limits.
func newServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes}
}

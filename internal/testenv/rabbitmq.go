package testenv

import (
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/bentoevents/bento/messaging"
)

// Exchange is a fresh, uniquely named exchange ("bt.<random>") on the test
// broker. At cleanup it deletes the exchange, the alternate and dead-letter
// exchanges bento derives from its name, their queues, and every queue
// registered with Queues.
type Exchange struct {
	// URL is the broker's address.
	URL string
	// Name is the exchange's name.
	Name string

	mu        sync.Mutex
	queues    []string
	exchanges []string
}

// NewExchange reserves a fresh exchange name on the test broker (see
// RequireAMQP) and registers its cleanup.
func NewExchange(t testing.TB) *Exchange {
	t.Helper()
	e := &Exchange{URL: RequireAMQP(t), Name: "bt." + randomHex(4)}
	t.Cleanup(e.delete)
	return e
}

// Queues registers queues to delete at cleanup.
func (e *Exchange) Queues(names ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.queues = append(e.queues, names...)
}

// Partitioned registers the n partition queues of group, its hash exchange
// and its dead-letter queue to delete at cleanup.
func (e *Exchange) Partitioned(group string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for p := range n {
		e.queues = append(e.queues, messaging.PartitionQueue(group, p))
	}
	e.queues = append(e.queues, group+".dead")
	e.exchanges = append(e.exchanges, e.Name+".hash."+group)
}

func (e *Exchange) delete() {
	conn, err := amqp.Dial(e.URL)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	e.mu.Lock()
	queues := append([]string(nil), e.queues...)
	exchanges := append([]string(nil), e.exchanges...)
	e.mu.Unlock()
	for _, ex := range []string{e.Name, e.Name + ".dead"} {
		queues = append(queues, ex+".unroutable")
	}
	for _, q := range queues {
		if strings.HasSuffix(q, ".dead") {
			queues = append(queues, q+".tap") // a partitioned group's copies of its dead letters
		}
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, ex := range append(exchanges, e.Name, e.Name+".unroutable", e.Name+".dead", e.Name+".dead.unroutable") {
		_ = ch.ExchangeDelete(ex, false, false)
	}
}

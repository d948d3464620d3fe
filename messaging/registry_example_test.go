package messaging_test

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/bentoevents/bento/messaging"
)

// CustomerSignedUpV1 is the first schema of customer.signed_up, still found in
// old messages: the customer's full name in one field.
type CustomerSignedUpV1 struct {
	Name string `json:"name"`
}

// EventType implements aggregate.Event.
func (CustomerSignedUpV1) EventType() string { return "customer.signed_up" }

// CustomerSignedUp is the current schema, version 2: the name split in two.
type CustomerSignedUp struct {
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name"`
}

// EventType implements aggregate.Event.
func (CustomerSignedUp) EventType() string { return "customer.signed_up" }

// SchemaVersion implements aggregate.Versioned.
func (CustomerSignedUp) SchemaVersion() int { return 2 }

func ExampleRegistry() {
	// At start-up: the current type, and how to upcast older versions to it.
	reg := messaging.NewRegistry()
	messaging.MustRegister[CustomerSignedUp](reg)
	messaging.MustRegisterUpcaster(reg, func(old CustomerSignedUpV1) (CustomerSignedUp, error) {
		first, last, _ := strings.Cut(old.Name, " ")
		return CustomerSignedUp{FirstName: first, LastName: last}, nil
	})
	fmt.Println(reg.Types())

	// A consumer receives a message written by a producer still on v1
	// (env would come from messaging.Decode).
	env := &messaging.Envelope{
		ID:            "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9",
		EventType:     "customer.signed_up",
		SchemaVersion: 1,
		Payload:       json.RawMessage(`{"name":"Ann Lee"}`),
	}
	e, err := reg.Decode(env)
	if err != nil {
		panic(err)
	}
	if c, ok := e.(CustomerSignedUp); ok {
		fmt.Printf("first=%s last=%s\n", c.FirstName, c.LastName)
	}

	// A message from a producer ahead of this consumer is refused.
	env.SchemaVersion = 3
	_, err = reg.Decode(env)
	fmt.Println(err)
	// Output:
	// [customer.signed_up]
	// first=Ann last=Lee
	// messaging: no upcaster for schema version: event "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9": customer.signed_up schema version 3 is newer than the current version 2
}

package messaging_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/messaging"
	"github.com/bentoevents/bento/outbox"
)

// Events of the registry tests. customer.registered went through three
// schema versions: v1 had one name field, v2 split it, v3 added a tier.

type orderPaid struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

func (orderPaid) EventType() string { return "order.paid" }

// orderPaidOther claims the event type of orderPaid.
type orderPaidOther struct {
	OrderID string `json:"order_id"`
}

func (orderPaidOther) EventType() string { return "order.paid" }

type orderShipped struct {
	OrderID string `json:"order_id"`
}

func (orderShipped) EventType() string { return "order.shipped" }

type accountOpened struct{}

func (accountOpened) EventType() string { return "account.opened" }

type customerRegisteredV1 struct {
	Customer string `json:"customer"`
}

func (customerRegisteredV1) EventType() string { return "customer.registered" }

type customerRegisteredV2 struct {
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name"`
}

func (customerRegisteredV2) EventType() string  { return "customer.registered" }
func (customerRegisteredV2) SchemaVersion() int { return 2 }

// customerRegisteredV2Other claims version 2 of customer.registered too.
type customerRegisteredV2Other struct {
	Name string `json:"name"`
}

func (customerRegisteredV2Other) EventType() string  { return "customer.registered" }
func (customerRegisteredV2Other) SchemaVersion() int { return 2 }

type customerRegisteredV3 struct {
	FirstName string `json:"first_name"`
	LastName  string `json:"last_name"`
	Tier      string `json:"tier"`
}

func (customerRegisteredV3) EventType() string  { return "customer.registered" }
func (customerRegisteredV3) SchemaVersion() int { return 3 }

type badTopic struct{}

func (badTopic) EventType() string { return "order.*" }

type versionZero struct{}

func (versionZero) EventType() string  { return "zero.version" }
func (versionZero) SchemaVersion() int { return 0 }

// pointerVersioned declares SchemaVersion on its pointer type, which its
// zero value would silently not see.
type pointerVersioned struct{}

func (pointerVersioned) EventType() string   { return "pointer.versioned" }
func (*pointerVersioned) SchemaVersion() int { return 2 }

func splitName(v1 customerRegisteredV1) (customerRegisteredV2, error) {
	first, last, _ := strings.Cut(v1.Customer, " ")
	return customerRegisteredV2{FirstName: first, LastName: last}, nil
}

func addTier(v2 customerRegisteredV2) (customerRegisteredV3, error) {
	return customerRegisteredV3{FirstName: v2.FirstName, LastName: v2.LastName, Tier: "standard"}, nil
}

func envelope(eventType string, version int, payload string) *messaging.Envelope {
	return &messaging.Envelope{
		ID:            "01JD3ZQ8Y7C1W4K3M5N6P7Q8R9",
		EventType:     eventType,
		SchemaVersion: version,
		Payload:       json.RawMessage(payload),
	}
}

// chainRegistry registers customer.registered v3 with upcasters v1→v2→v3.
func chainRegistry(t *testing.T) *messaging.Registry {
	t.Helper()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.RegisterUpcaster(r, splitName))
	require.NoError(t, messaging.RegisterUpcaster(r, addTier))
	require.NoError(t, messaging.Register[customerRegisteredV3](r))
	return r
}

// recoverError runs f and returns the error it panics with.
func recoverError(t *testing.T, f func()) (err error) {
	t.Helper()
	defer func() {
		r := recover()
		require.NotNil(t, r, "no panic")
		var ok bool
		err, ok = r.(error)
		require.True(t, ok, "panic value %v is not an error", r)
	}()
	f()
	return nil
}

func TestRegistryDecodeCurrentVersion(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.Register[orderPaid](r))

	v, ok := r.Current("order.paid")
	require.True(t, ok)
	assert.Equal(t, 1, v)

	e, err := r.Decode(envelope("order.paid", 1, `{"order_id":"o-1","amount_cents":1200,"later_field":true}`))
	require.NoError(t, err)
	assert.Equal(t, orderPaid{OrderID: "o-1", AmountCents: 1200}, e, "a value, not a pointer; unknown fields ignored")
}

func TestRegistryRegisterIdempotent(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.Register[orderPaid](r))
	require.NoError(t, messaging.Register[orderPaid](r))
	messaging.MustRegister[orderPaid](r)
	assert.Equal(t, []string{"order.paid"}, r.Types())
}

func TestUpcastV1ToV2(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	// Upcasters may be registered before the current type.
	require.NoError(t, messaging.RegisterUpcaster(r, splitName))
	require.NoError(t, messaging.Register[customerRegisteredV2](r))

	v, ok := r.Current("customer.registered")
	require.True(t, ok)
	assert.Equal(t, 2, v)

	e, err := r.Decode(envelope("customer.registered", 1, `{"customer":"Ann Lee"}`))
	require.NoError(t, err)
	assert.Equal(t, customerRegisteredV2{FirstName: "Ann", LastName: "Lee"}, e)

	e, err = r.Decode(envelope("customer.registered", 2, `{"first_name":"Bo","last_name":"Ek"}`))
	require.NoError(t, err)
	assert.Equal(t, customerRegisteredV2{FirstName: "Bo", LastName: "Ek"}, e)
}

func TestUpcastChain(t *testing.T) {
	t.Parallel()
	r := chainRegistry(t)

	for _, tc := range []struct {
		version int
		payload string
		want    customerRegisteredV3
	}{
		{1, `{"customer":"Ann Lee"}`, customerRegisteredV3{FirstName: "Ann", LastName: "Lee", Tier: "standard"}},
		{2, `{"first_name":"Bo","last_name":"Ek"}`, customerRegisteredV3{FirstName: "Bo", LastName: "Ek", Tier: "standard"}},
		{3, `{"first_name":"Cy","last_name":"Yu","tier":"gold"}`, customerRegisteredV3{FirstName: "Cy", LastName: "Yu", Tier: "gold"}},
	} {
		t.Run(fmt.Sprintf("v%d", tc.version), func(t *testing.T) {
			t.Parallel()
			e, err := r.Decode(envelope("customer.registered", tc.version, tc.payload))
			require.NoError(t, err)
			assert.Equal(t, tc.want, e)
		})
	}
}

func TestRegistryUnknownEventType(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.Register[orderPaid](r))
	// An upcaster alone does not make an event type known.
	require.NoError(t, messaging.RegisterUpcaster(r, splitName))

	for _, et := range []string{"order.refunded", "customer.registered", ""} {
		_, err := r.Decode(envelope(et, 1, `{}`))
		require.ErrorIs(t, err, messaging.ErrUnknownEventType, et)
		assert.NotErrorIs(t, err, messaging.ErrUnknownSchemaVersion, et)
	}
	_, ok := r.Current("order.refunded")
	assert.False(t, ok)
}

func TestUpcastUnknownOlderVersion(t *testing.T) {
	t.Parallel()

	t.Run("no first step", func(t *testing.T) {
		t.Parallel()
		r := messaging.NewRegistry()
		require.NoError(t, messaging.RegisterUpcaster(r, addTier))
		require.NoError(t, messaging.Register[customerRegisteredV3](r))
		for _, v := range []int{1, 0, -1} {
			_, err := r.Decode(envelope("customer.registered", v, `{"customer":"Ann Lee"}`))
			require.ErrorIs(t, err, messaging.ErrUnknownSchemaVersion, "version %d", v)
		}
	})

	t.Run("gap in the chain", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		r := messaging.NewRegistry()
		require.NoError(t, messaging.RegisterUpcaster(r, func(v1 customerRegisteredV1) (customerRegisteredV2, error) {
			calls.Add(1)
			return splitName(v1)
		}))
		require.NoError(t, messaging.Register[customerRegisteredV3](r))
		_, err := r.Decode(envelope("customer.registered", 1, `{"customer":"Ann Lee"}`))
		require.ErrorIs(t, err, messaging.ErrUnknownSchemaVersion)
		assert.Zero(t, calls.Load(), "the chain is checked before any upcaster runs")
	})

	t.Run("chain past the current version", func(t *testing.T) {
		t.Parallel()
		r := messaging.NewRegistry()
		require.NoError(t, messaging.RegisterUpcaster(r, func(v1 customerRegisteredV1) (customerRegisteredV3, error) {
			return customerRegisteredV3{FirstName: v1.Customer}, nil
		}))
		require.NoError(t, messaging.Register[customerRegisteredV2](r))
		_, err := r.Decode(envelope("customer.registered", 1, `{"customer":"Ann Lee"}`))
		require.ErrorIs(t, err, messaging.ErrUnknownSchemaVersion)
	})
}

func TestUpcastNewerVersion(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.RegisterUpcaster(r, splitName))
	require.NoError(t, messaging.Register[customerRegisteredV2](r))

	_, err := r.Decode(envelope("customer.registered", 3, `{"first_name":"Ann","last_name":"Lee","tier":"gold"}`))
	require.ErrorIs(t, err, messaging.ErrUnknownSchemaVersion)
	// The message must tell an operator that a producer is ahead of us.
	assert.ErrorContains(t, err, "newer than the current version 2")
}

func TestRegistryMalformedPayload(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	require.NoError(t, messaging.Register[orderPaid](r))
	require.NoError(t, messaging.RegisterUpcaster(r, splitName))
	require.NoError(t, messaging.Register[customerRegisteredV2](r))

	for _, tc := range []struct {
		name      string
		eventType string
		version   int
		payload   string
		jsonErr   any // a pointer to the expected encoding/json error type, or nil
	}{
		{"invalid JSON", "order.paid", 1, `{"order_id":`, new(*json.SyntaxError)},
		{"string for an int field", "order.paid", 1, `{"order_id":"o-1","amount_cents":"ten"}`, new(*json.UnmarshalTypeError)},
		{"null", "order.paid", 1, `null`, nil},
		{"null with spaces", "order.paid", 1, " null\n", nil},
		{"string", "order.paid", 1, `"o-1"`, nil},
		{"array", "order.paid", 1, `[{"order_id":"o-1"}]`, nil},
		{"number", "order.paid", 1, `12`, nil},
		{"empty", "order.paid", 1, ``, nil},
		{"old version of wrong shape", "customer.registered", 1, `{"customer":42}`, new(*json.UnmarshalTypeError)},
		{"old version null", "customer.registered", 1, `null`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := r.Decode(envelope(tc.eventType, tc.version, tc.payload))
			require.ErrorIs(t, err, messaging.ErrMalformedPayload)
			assert.Nil(t, e)
			if tc.jsonErr != nil {
				assert.ErrorAs(t, err, tc.jsonErr, "the encoding/json error is wrapped")
			}
		})
	}

	_, err := r.Decode(nil)
	require.ErrorIs(t, err, messaging.ErrMalformedPayload)
}

func TestUpcastError(t *testing.T) {
	t.Parallel()
	errNoName := errors.New("customer has no name")
	r := messaging.NewRegistry()
	require.NoError(t, messaging.RegisterUpcaster(r, func(v1 customerRegisteredV1) (customerRegisteredV2, error) {
		if v1.Customer == "" {
			return customerRegisteredV2{}, errNoName
		}
		return splitName(v1)
	}))
	require.NoError(t, messaging.RegisterUpcaster(r, addTier))
	require.NoError(t, messaging.Register[customerRegisteredV3](r))

	e, err := r.Decode(envelope("customer.registered", 1, `{"customer":""}`))
	require.ErrorIs(t, err, errNoName)
	require.ErrorIs(t, err, messaging.ErrUpcast, "consumers dead-letter failed upcasts at once")
	assert.Nil(t, e)
	assert.NotErrorIs(t, err, messaging.ErrMalformedPayload)
	assert.NotErrorIs(t, err, messaging.ErrUnknownSchemaVersion)
}

func TestRegistryRegistrationErrors(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name     string
		register func(r *messaging.Registry) error
	}{
		{"two Go types for one event type", func(r *messaging.Registry) error {
			require.NoError(t, messaging.Register[orderPaid](r))
			return messaging.Register[orderPaidOther](r)
		}},
		{"newer Go type for a registered event type", func(r *messaging.Registry) error {
			require.NoError(t, messaging.Register[customerRegisteredV2](r))
			return messaging.Register[customerRegisteredV3](r)
		}},
		{"pointer type", func(r *messaging.Registry) error {
			return messaging.Register[*orderPaid](r)
		}},
		{"interface type", func(r *messaging.Registry) error {
			return messaging.Register[aggregate.Event](r)
		}},
		{"schema version below 1", func(r *messaging.Registry) error {
			return messaging.Register[versionZero](r)
		}},
		{"SchemaVersion on the pointer type", func(r *messaging.Registry) error {
			return messaging.Register[pointerVersioned](r)
		}},
		{"nil registry", func(*messaging.Registry) error {
			return messaging.Register[orderPaid](nil)
		}},
		{"upcaster between event types", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster(r, func(customerRegisteredV1) (orderPaid, error) {
				return orderPaid{}, nil
			})
		}},
		{"upcaster from a newer version", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster(r, func(customerRegisteredV2) (customerRegisteredV1, error) {
				return customerRegisteredV1{}, nil
			})
		}},
		{"upcaster between equal versions", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster(r, func(orderPaid) (orderPaidOther, error) {
				return orderPaidOther{}, nil
			})
		}},
		{"upcaster to the same type", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster(r, func(e orderPaid) (orderPaid, error) { return e, nil })
		}},
		{"duplicate upcaster", func(r *messaging.Registry) error {
			require.NoError(t, messaging.RegisterUpcaster(r, splitName))
			return messaging.RegisterUpcaster(r, splitName)
		}},
		{"second upcaster from the same version", func(r *messaging.Registry) error {
			require.NoError(t, messaging.RegisterUpcaster(r, splitName))
			return messaging.RegisterUpcaster(r, func(customerRegisteredV1) (customerRegisteredV3, error) {
				return customerRegisteredV3{}, nil
			})
		}},
		{"upcaster to another type of the current version", func(r *messaging.Registry) error {
			require.NoError(t, messaging.Register[customerRegisteredV2](r))
			return messaging.RegisterUpcaster(r, func(customerRegisteredV1) (customerRegisteredV2Other, error) {
				return customerRegisteredV2Other{}, nil
			})
		}},
		{"current type other than an upcaster's", func(r *messaging.Registry) error {
			require.NoError(t, messaging.RegisterUpcaster(r, splitName))
			return messaging.Register[customerRegisteredV2Other](r)
		}},
		{"upcasters disagreeing on a version's type", func(r *messaging.Registry) error {
			require.NoError(t, messaging.RegisterUpcaster(r, addTier))
			return messaging.RegisterUpcaster(r, func(customerRegisteredV2Other) (customerRegisteredV3, error) {
				return customerRegisteredV3{}, nil
			})
		}},
		{"upcaster with a pointer type", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster(r, func(*customerRegisteredV1) (customerRegisteredV2, error) {
				return customerRegisteredV2{}, nil
			})
		}},
		{"nil upcaster", func(r *messaging.Registry) error {
			return messaging.RegisterUpcaster[customerRegisteredV1, customerRegisteredV2](r, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.register(messaging.NewRegistry())
			require.ErrorIs(t, err, messaging.ErrRegistration)
		})
	}

	t.Run("invalid topic", func(t *testing.T) {
		t.Parallel()
		r := messaging.NewRegistry()
		err := messaging.Register[badTopic](r)
		require.ErrorIs(t, err, messaging.ErrRegistration)
		assert.ErrorIs(t, err, outbox.ErrInvalidEvent, "the validation error is wrapped")
		assert.Empty(t, r.Types())
	})

	t.Run("a refused registration changes nothing", func(t *testing.T) {
		t.Parallel()
		r := messaging.NewRegistry()
		require.NoError(t, messaging.Register[orderPaid](r))
		require.ErrorIs(t, messaging.Register[orderPaidOther](r), messaging.ErrRegistration)
		e, err := r.Decode(envelope("order.paid", 1, `{"order_id":"o-1","amount_cents":5}`))
		require.NoError(t, err)
		assert.Equal(t, orderPaid{OrderID: "o-1", AmountCents: 5}, e)
	})
}

func TestRegistryMustRegisterPanics(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	messaging.MustRegister[orderPaid](r)
	messaging.MustRegisterUpcaster(r, splitName)

	err := recoverError(t, func() { messaging.MustRegister[orderPaidOther](r) })
	assert.ErrorIs(t, err, messaging.ErrRegistration)

	err = recoverError(t, func() { messaging.MustRegisterUpcaster(r, splitName) })
	assert.ErrorIs(t, err, messaging.ErrRegistration)
}

func TestRegistryConcurrentDecode(t *testing.T) {
	t.Parallel()
	r := chainRegistry(t)
	require.NoError(t, messaging.Register[orderPaid](r))

	const goroutines, rounds = 32, 200
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				var (
					e    aggregate.Event
					err  error
					want aggregate.Event
				)
				switch (g + i) % 4 {
				case 0:
					e, err = r.Decode(envelope("customer.registered", 1, `{"customer":"Ann Lee"}`))
					want = customerRegisteredV3{FirstName: "Ann", LastName: "Lee", Tier: "standard"}
				case 1:
					e, err = r.Decode(envelope("order.paid", 1, fmt.Sprintf(`{"order_id":"o-%d","amount_cents":%d}`, g, i)))
					want = orderPaid{OrderID: fmt.Sprintf("o-%d", g), AmountCents: int64(i)}
				case 2:
					// Idempotent registrations and reads race with Decode.
					err = messaging.Register[orderPaid](r)
					if v, ok := r.Current("customer.registered"); !ok || v != 3 {
						err = fmt.Errorf("Current = %d, %v", v, ok)
					}
					_ = r.Types()
				case 3:
					_, err = r.Decode(envelope("customer.registered", 4, `{}`))
					if errors.Is(err, messaging.ErrUnknownSchemaVersion) {
						err = nil
					}
				}
				if err == nil && want != nil && e != want {
					err = fmt.Errorf("decoded %#v, want %#v", e, want)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

func TestRegistryTypesSorted(t *testing.T) {
	t.Parallel()
	r := messaging.NewRegistry()
	assert.Empty(t, r.Types())

	require.NoError(t, messaging.Register[orderShipped](r))
	require.NoError(t, messaging.Register[customerRegisteredV3](r))
	require.NoError(t, messaging.Register[orderPaid](r))
	require.NoError(t, messaging.Register[accountOpened](r))
	require.NoError(t, messaging.RegisterUpcaster(r, addTier))

	types := r.Types()
	assert.Equal(t, []string{"account.opened", "customer.registered", "order.paid", "order.shipped"}, types)
	types[0] = "changed"
	assert.Equal(t, "account.opened", r.Types()[0], "Types returns a copy")
}

package messaging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/bentoevents/bento/aggregate"
	"github.com/bentoevents/bento/outbox"
)

// Errors returned by [Registry] and its registration functions.
var (
	// ErrUnknownEventType is returned by [Registry.Decode] for an envelope
	// whose event type has no registered current type.
	ErrUnknownEventType = errors.New("messaging: unknown event type")
	// ErrUnknownSchemaVersion is returned by [Registry.Decode] when the event
	// type is known but the envelope's schema version is neither the current
	// one nor reachable from it through upcasters, including a version newer
	// than the current one.
	ErrUnknownSchemaVersion = errors.New("messaging: no upcaster for schema version")
	// ErrMalformedPayload is returned by [Registry.Decode] for a payload that
	// is not a JSON object or does not decode into the registered Go type.
	// The encoding/json error, when there is one, is wrapped too.
	ErrMalformedPayload = errors.New("messaging: malformed payload")
	// ErrRegistration is returned by [Register] and [RegisterUpcaster] for an
	// invalid registration or one that conflicts with an earlier one.
	ErrRegistration = errors.New("messaging: invalid registration")
	// ErrUpcast is returned (wrapping the upcaster's own error) when an
	// upcaster fails. Upcasters are deterministic, so consumers treat it as
	// permanent: retrying cannot fix it.
	ErrUpcast = errors.New("messaging: upcast failed")
)

// maxUpcastSteps bounds an upcasting chain. Versions strictly increase along
// a chain, so it cannot loop; the bound is a second line of defence.
const maxUpcastSteps = 1000

// versionedIface is the aggregate.Versioned interface type.
var versionedIface = reflect.TypeFor[aggregate.Versioned]()

// Registry maps an event type (the topic) and schema version to a Go type,
// and holds upcasters that turn older schema versions into the current type.
// A Registry is safe for concurrent use; build it at start-up with
// [Register] and [RegisterUpcaster], then share it between consumers. The
// zero value is not usable; call [NewRegistry].
type Registry struct {
	mu sync.RWMutex
	// current holds the current type of each registered event type.
	current map[string]registered
	// types holds the Go type of every (event type, version) seen, current
	// types and upcasters' Old and New types alike.
	types map[versionKey]reflect.Type
	// upcasters holds the upcaster from each (event type, Old version).
	upcasters map[versionKey]upcaster
}

type registered struct {
	typ     reflect.Type
	version int
}

type versionKey struct {
	eventType string
	version   int
}

type upcaster struct {
	oldType, newType       reflect.Type
	oldVersion, newVersion int
	call                   func(any) (any, error)
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		current:   map[string]registered{},
		types:     map[versionKey]reflect.Type{},
		upcasters: map[versionKey]upcaster{},
	}
}

// Register records E as the current type of its event type: a struct type,
// registered by value, whose zero value's EventType gives the event type and
// whose aggregate.SchemaVersionOf gives the current schema version.
// [Registry.Decode] returns payloads of that event type as E values.
//
// Registering the same type again is a no-op. It returns an error wrapping
// [ErrRegistration] when r is nil, E is not a struct type, SchemaVersion is
// declared on *E rather than E, the event type is not a valid topic (see
// outbox.ValidateTopic; that error is wrapped too), the schema version is
// below 1, another Go type is already the current type of the event type, or
// an upcaster already uses another Go type for the same event type and
// schema version.
func Register[E aggregate.Event](r *Registry) error {
	t := reflect.TypeFor[E]()
	fail := func(err error) error {
		return fmt.Errorf("%w: register %v: %w", ErrRegistration, t, err)
	}
	if r == nil {
		return fail(errors.New("nil registry"))
	}
	eventType, version, err := describe(t)
	if err != nil {
		return fail(err)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.current[eventType]; ok {
		if cur.typ == t {
			return nil
		}
		return fail(fmt.Errorf("event type %q is already registered as %v (schema version %d)",
			eventType, cur.typ, cur.version))
	}
	k := versionKey{eventType, version}
	if err := r.checkTypeLocked(k, t); err != nil {
		return fail(err)
	}
	r.current[eventType] = registered{typ: t, version: version}
	r.types[k] = t
	return nil
}

// MustRegister is like [Register] but panics with its error.
func MustRegister[E aggregate.Event](r *Registry) {
	if err := Register[E](r); err != nil {
		panic(err)
	}
}

// RegisterUpcaster records fn, which turns schema version Old of an event
// type into the newer version New. Old and New must be struct types of the
// same event type with aggregate.SchemaVersionOf(Old) below
// aggregate.SchemaVersionOf(New). Upcasters chain: with v1→v2 and v2→v3
// registered and v3 the current type, a v1 payload is decoded as v1 and
// passed through both. Registration order does not matter; the current type
// may be registered before or after its upcasters.
//
// It returns an error wrapping [ErrRegistration] when r or fn is nil, Old or
// New is not a valid event struct type (as for [Register]), their event
// types differ, Old's version is not below New's, an upcaster from the same
// event type and Old version is already registered, or another Go type is
// already registered for the event type at Old's or New's version.
func RegisterUpcaster[Old, New aggregate.Event](r *Registry, fn func(Old) (New, error)) error {
	ot, nt := reflect.TypeFor[Old](), reflect.TypeFor[New]()
	fail := func(err error) error {
		return fmt.Errorf("%w: upcaster %v → %v: %w", ErrRegistration, ot, nt, err)
	}
	switch {
	case r == nil:
		return fail(errors.New("nil registry"))
	case fn == nil:
		return fail(errors.New("nil function"))
	}
	oldET, oldV, err := describe(ot)
	if err != nil {
		return fail(err)
	}
	newET, newV, err := describe(nt)
	if err != nil {
		return fail(err)
	}
	if oldET != newET {
		return fail(fmt.Errorf("event types differ: %q and %q", oldET, newET))
	}
	if oldV >= newV {
		return fail(fmt.Errorf("schema version %d is not below %d", oldV, newV))
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	oldKey, newKey := versionKey{oldET, oldV}, versionKey{newET, newV}
	if u, dup := r.upcasters[oldKey]; dup {
		return fail(fmt.Errorf("event type %q already has an upcaster from schema version %d (%v → %v)",
			oldET, oldV, u.oldType, u.newType))
	}
	for _, c := range []struct {
		k versionKey
		t reflect.Type
	}{{oldKey, ot}, {newKey, nt}} {
		if err := r.checkTypeLocked(c.k, c.t); err != nil {
			return fail(err)
		}
	}
	r.upcasters[oldKey] = upcaster{
		oldType:    ot,
		newType:    nt,
		oldVersion: oldV,
		newVersion: newV,
		call: func(v any) (any, error) {
			old, ok := v.(Old)
			if !ok {
				// Unreachable: each (event type, version) has one Go type.
				return nil, fmt.Errorf("upcaster expects %v, got %T", ot, v)
			}
			n, err := fn(old)
			if err != nil {
				return nil, err
			}
			return n, nil
		},
	}
	r.types[oldKey] = ot
	r.types[newKey] = nt
	return nil
}

// MustRegisterUpcaster is like [RegisterUpcaster] but panics with its error.
func MustRegisterUpcaster[Old, New aggregate.Event](r *Registry, fn func(Old) (New, error)) {
	if err := RegisterUpcaster(r, fn); err != nil {
		panic(err)
	}
}

// Decode returns env's payload as a value of the current registered type of
// env.EventType (a struct value, not a pointer). When env.SchemaVersion is
// older than the current version, the payload is decoded into the type of
// that version and passed through the upcasters up to the current one.
// Unknown JSON fields are ignored.
//
// It returns an error wrapping [ErrUnknownEventType] when the event type has
// no registered current type; [ErrUnknownSchemaVersion] when the version is
// newer than the current one or no chain of upcasters leads from it to the
// current one (nothing is decoded then); [ErrMalformedPayload] when the
// payload is not a JSON object (null included) or does not decode into the
// Go type, wrapping the encoding/json error too; or the error of a failing
// upcaster, wrapped with the step that failed.
func (r *Registry) Decode(env *Envelope) (aggregate.Event, error) {
	if env == nil {
		return nil, fmt.Errorf("%w: nil envelope", ErrMalformedPayload)
	}
	cur, steps, err := r.plan(env)
	if err != nil {
		return nil, err
	}

	first := cur.typ
	if len(steps) > 0 {
		first = steps[0].oldType
	}
	v, err := decodePayload(env.Payload, first)
	if err != nil {
		return nil, fmt.Errorf("%w: event %q: %s schema version %d into %v: %w",
			ErrMalformedPayload, env.ID, env.EventType, env.SchemaVersion, first, err)
	}
	for _, s := range steps {
		if v, err = s.call(v); err != nil {
			return nil, fmt.Errorf("%w: event %q: upcast %s from schema version %d to %d: %w", ErrUpcast,
				env.ID, env.EventType, s.oldVersion, s.newVersion, err)
		}
	}
	e, ok := v.(aggregate.Event)
	if !ok || reflect.TypeOf(v) != cur.typ {
		// Unreachable: plan checked the chain ends at the current type.
		return nil, fmt.Errorf("%w: event %q: %s upcast to %T, not the current type %v",
			ErrUnknownSchemaVersion, env.ID, env.EventType, v, cur.typ)
	}
	return e, nil
}

// plan returns the current registration of env's event type and the
// upcasters that lead from env's schema version to it, in order; none when
// the version is current.
func (r *Registry) plan(env *Envelope) (registered, []upcaster, error) {
	eventType, version := env.EventType, env.SchemaVersion
	r.mu.RLock()
	defer r.mu.RUnlock()
	cur, ok := r.current[eventType]
	if !ok {
		return registered{}, nil, fmt.Errorf("%w %q (event %q)", ErrUnknownEventType, eventType, env.ID)
	}
	fail := func(format string, args ...any) (registered, []upcaster, error) {
		return cur, nil, fmt.Errorf("%w: event %q: %s %s", ErrUnknownSchemaVersion, env.ID, eventType, fmt.Sprintf(format, args...))
	}
	if version > cur.version {
		return fail("schema version %d is newer than the current version %d", version, cur.version)
	}
	var steps []upcaster
	for v := version; v != cur.version; {
		u, ok := r.upcasters[versionKey{eventType, v}]
		switch {
		case !ok && v == version:
			return fail("schema version %d (current version %d)", v, cur.version)
		case !ok:
			return fail("schema version %d, reached from %d (current version %d)", v, version, cur.version)
		case u.newVersion > cur.version:
			return fail("upcaster from schema version %d leads to %d, past the current version %d",
				v, u.newVersion, cur.version)
		case len(steps) == maxUpcastSteps:
			return fail("schema version %d: more than %d upcasting steps", version, maxUpcastSteps)
		}
		steps = append(steps, u)
		v = u.newVersion
	}
	if n := len(steps); n > 0 && steps[n-1].newType != cur.typ {
		// Unreachable: each (event type, version) has one Go type.
		return fail("upcasters end at %v, not the current type %v", steps[n-1].newType, cur.typ)
	}
	return cur, steps, nil
}

// Types returns the event types that have a registered current type, sorted.
// Event types that only have upcasters are not listed.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	types := make([]string, 0, len(r.current))
	for et := range r.current {
		types = append(types, et)
	}
	slices.Sort(types)
	return types
}

// Current reports the schema version of the current registered type of
// eventType, and whether the event type is registered.
func (r *Registry) Current(eventType string) (version int, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	cur, ok := r.current[eventType]
	return cur.version, ok
}

// checkTypeLocked returns an error when another Go type than t is already
// known for k. r.mu must be held.
func (r *Registry) checkTypeLocked(k versionKey, t reflect.Type) error {
	if prev, ok := r.types[k]; ok && prev != t {
		return fmt.Errorf("event type %q schema version %d is already %v",
			k.eventType, k.version, prev)
	}
	return nil
}

// describe checks that t is an event struct type and returns its event type
// and schema version, taken from its zero value.
func describe(t reflect.Type) (eventType string, version int, err error) {
	if t.Kind() != reflect.Struct {
		return "", 0, fmt.Errorf("%v is not a struct type (register events by value, not by pointer)", t)
	}
	if !t.Implements(versionedIface) && reflect.PointerTo(t).Implements(versionedIface) {
		return "", 0, fmt.Errorf("%v declares SchemaVersion on the pointer type; declare it on the value type", t)
	}
	zero, ok := reflect.Zero(t).Interface().(aggregate.Event)
	if !ok {
		// Unreachable: the type parameters are constrained to aggregate.Event.
		return "", 0, fmt.Errorf("%v is not an aggregate.Event", t)
	}
	eventType = zero.EventType()
	if err := outbox.ValidateTopic(eventType); err != nil {
		return "", 0, fmt.Errorf("%v event type: %w", t, err)
	}
	version = aggregate.SchemaVersionOf(zero)
	if version < 1 {
		return "", 0, fmt.Errorf("%v schema version %d is not positive", t, version)
	}
	return eventType, version, nil
}

// decodePayload decodes payload, which must be a JSON object, into a new
// value of t and returns that value (not a pointer to it).
func decodePayload(payload json.RawMessage, t reflect.Type) (any, error) {
	p := bytes.TrimSpace(payload)
	switch {
	case len(p) == 0:
		return nil, errors.New("payload is empty")
	case bytes.Equal(p, []byte("null")):
		return nil, errors.New("payload is null")
	case p[0] != '{':
		return nil, errors.New("payload is not a JSON object")
	}
	ptr := reflect.New(t)
	if err := json.Unmarshal(p, ptr.Interface()); err != nil {
		return nil, err
	}
	return ptr.Elem().Interface(), nil
}

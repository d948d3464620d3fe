package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// floatList is a comma-separated flag of numbers.
type floatList []float64

// String implements flag.Value.
func (l *floatList) String() string {
	var s []string
	for _, x := range *l {
		s = append(s, strconv.FormatFloat(x, 'f', -1, 64))
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (l *floatList) Set(v string) error {
	out, err := parseList(v, func(s string) (float64, error) { return strconv.ParseFloat(s, 64) })
	*l = out
	return err
}

// intList is a comma-separated flag of integers.
type intList []int

// String implements flag.Value.
func (l *intList) String() string {
	var s []string
	for _, x := range *l {
		s = append(s, strconv.Itoa(x))
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (l *intList) Set(v string) error {
	out, err := parseList(v, strconv.Atoi)
	*l = out
	return err
}

// durationList is a comma-separated flag of durations.
type durationList []time.Duration

// String implements flag.Value.
func (l *durationList) String() string { return durationsText(*l) }

// Set implements flag.Value.
func (l *durationList) Set(v string) error {
	out, err := parseList(v, time.ParseDuration)
	*l = out
	return err
}

// stringList is a comma-separated flag of words.
type stringList []string

// String implements flag.Value.
func (l *stringList) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value.
func (l *stringList) Set(v string) error {
	out, err := parseList(v, func(s string) (string, error) { return s, nil })
	*l = out
	return err
}

// parseList splits v at commas, trims and parses each item; an empty v is
// an empty list.
func parseList[T any](v string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	if strings.TrimSpace(v) == "" {
		return out, nil
	}
	for _, s := range strings.Split(v, ",") {
		x, err := parse(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

func (c steadyConfig) validate() error {
	var errs []error
	if len(c.Rates) == 0 {
		errs = append(errs, errors.New("-steady-rates: none"))
	}
	for _, r := range c.Rates {
		if r <= 0 {
			errs = append(errs, fmt.Errorf("-steady-rates: %v, must be positive", r))
		}
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("-steady-duration: %v, must be positive", c.Duration))
	}
	if c.Warmup < 0 || c.Idle < 0 {
		errs = append(errs, errors.New("-steady-warmup and -idle must not be negative"))
	}
	if c.Writers < 1 {
		errs = append(errs, fmt.Errorf("-steady-writers: %d, must be at least 1", c.Writers))
	}
	for _, p := range c.PeerPolls {
		if p <= 0 {
			errs = append(errs, fmt.Errorf("-peer-polls: %v, must be positive", p))
		}
	}
	return errors.Join(errs...)
}

func (c steadyConfig) ratesText() string {
	l := floatList(c.Rates)
	return l.String()
}

func (c consumeConfig) validate() error {
	var errs []error
	if c.Messages < 2 {
		errs = append(errs, fmt.Errorf("-consume-messages: %d, must be at least 2", c.Messages))
	}
	if len(c.Concurrency) == 0 {
		errs = append(errs, errors.New("-consume-consumers: none"))
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			errs = append(errs, fmt.Errorf("-consume-consumers: %d, must be at least 1", n))
		}
	}
	if len(c.Handlers) == 0 {
		errs = append(errs, errors.New("-consume-handlers: none"))
	}
	for _, h := range c.Handlers {
		if !slices.Contains(consumeHandlers, h) {
			errs = append(errs, fmt.Errorf("-consume-handlers: %q, want one of %s", h, strings.Join(consumeHandlers, ", ")))
		}
	}
	if len(c.Modes) == 0 {
		errs = append(errs, errors.New("-consume-modes: none"))
	}
	for _, m := range c.Modes {
		if !slices.Contains(consumeModes, m) {
			errs = append(errs, fmt.Errorf("-consume-modes: %q, want one of %s", m, strings.Join(consumeModes, ", ")))
		}
	}
	return errors.Join(errs...)
}

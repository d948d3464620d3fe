package messaging

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/bentoevents/bento/internal/clip"
)

// ErrInvalidName is returned for a topic, binding pattern, consumer group or
// exchange name that does not have the required form.
var ErrInvalidName = errors.New("messaging: invalid name")

// maxRoutingKeyLen is the AMQP short-string limit on routing and binding keys.
const maxRoutingKeyLen = 255

var (
	// nameRE is the form of consumer group (queue) and exchange names.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,200}$`)
	// wordRE is the form of one word of a topic.
	wordRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

// MatchTopic reports whether topic matches the binding pattern with the
// semantics of an AMQP topic exchange: both are words separated by '.', a '*'
// word in the pattern matches exactly one word, a '#' word matches zero or
// more words, and any other word matches itself. The empty string has no
// words. For example "order.*" matches "order.paid" but not "order" nor
// "order.paid.late"; "order.#" matches all three; "#" matches every topic.
func MatchTopic(pattern, topic string) bool {
	p, t := words(pattern), words(topic)
	// next[j] reports whether p[i+1:] matches t[j:]; cur[j] whether p[i:]
	// does. Filled from the end of the pattern backwards.
	next := make([]bool, len(t)+1)
	cur := make([]bool, len(t)+1)
	next[len(t)] = true
	for i := len(p) - 1; i >= 0; i-- {
		switch w := p[i]; w {
		case "#":
			cur[len(t)] = next[len(t)]
			for j := len(t) - 1; j >= 0; j-- {
				cur[j] = next[j] || cur[j+1]
			}
		default:
			cur[len(t)] = false
			for j := len(t) - 1; j >= 0; j-- {
				cur[j] = (w == "*" || w == t[j]) && next[j+1]
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

func words(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

// validateTopic checks a topic (routing key): 1 to 255 bytes of words of
// ASCII letters, digits, '_' and '-' separated by single dots.
func validateTopic(topic string) error {
	if r := checkWords(topic, false); r != "" {
		return fmt.Errorf("%w: topic %q %s", ErrInvalidName, clip.String(topic), r)
	}
	return nil
}

// validatePatterns checks binding patterns: at least one, each a topic whose
// words may also be '*' or '#'.
func validatePatterns(patterns []string) error {
	if len(patterns) == 0 {
		return fmt.Errorf("%w: no binding pattern given", ErrInvalidName)
	}
	var errs []error
	for _, p := range patterns {
		if r := checkWords(p, true); r != "" {
			errs = append(errs, fmt.Errorf("%w: pattern %q %s", ErrInvalidName, clip.String(p), r))
		}
	}
	return errors.Join(errs...)
}

// validateGroup checks a consumer group name, which is also its queue name.
func validateGroup(group string) error {
	if r := checkName(group); r != "" {
		return fmt.Errorf("%w: group %q %s", ErrInvalidName, clip.String(group), r)
	}
	return nil
}

// checkName checks a queue or exchange name and returns what is wrong with
// it, or "".
func checkName(name string) string {
	switch {
	case name == "":
		return "is empty"
	case !nameRE.MatchString(name):
		return "must be 1 to 200 ASCII letters, digits, '_', '.', ':' or '-'"
	case strings.HasPrefix(name, "amq."):
		return `must not start with "amq." (reserved by the broker)`
	}
	return ""
}

// checkWords checks a topic, or a binding pattern when wildcards is true,
// and returns what is wrong with it, or "".
func checkWords(s string, wildcards bool) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > maxRoutingKeyLen {
		return fmt.Sprintf("is longer than %d bytes", maxRoutingKeyLen)
	}
	for _, w := range strings.Split(s, ".") {
		if wildcards && (w == "*" || w == "#") {
			continue
		}
		if !wordRE.MatchString(w) {
			if wildcards {
				return "must be dot-separated words of ASCII letters, digits, '_' or '-', or the wildcards '*' and '#'"
			}
			return "must be dot-separated words of ASCII letters, digits, '_' or '-'"
		}
	}
	return ""
}

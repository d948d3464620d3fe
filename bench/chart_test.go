package main

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestDrainChartIsWellFormedSVG(t *testing.T) {
	t.Parallel()
	svg := drainChart("Relay drain <PG> & AMQP", "sub", []bar{
		{Label: "bento", Value: 12345, Note: "12.3x peer", Family: "bento"},
		{Label: "peer", Value: 1000, Family: "peer"},
		{Label: "bare", Value: 20000, Family: "bare"},
	})
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{"12,345/s", "&lt;PG&gt; &amp; AMQP", "20,000/s"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestNiceStepAndThousands(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, want float64 }{{3800, 5000}, {1000, 1000}, {1200, 2000}, {0.3, 0.5}} {
		if got := niceStep(c.raw); got != c.want {
			t.Errorf("niceStep(%v) = %v, want %v", c.raw, got, c.want)
		}
	}
	for _, c := range []struct {
		v    float64
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567.4, "1,234,567"}} {
		if got := thousands(c.v); got != c.want {
			t.Errorf("thousands(%v) = %q, want %q", c.v, got, c.want)
		}
	}
}

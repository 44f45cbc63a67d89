package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Fleet-wide limits per kind (docs/protocol.md §2.4) live in bucket limits:
//
//	def.<queue>.<kind>       the KindLimit document (JSON)
//	slot.<queue>.<kind>.<i>  concurrency slot i (0 ≤ i < concurrency), taken by a running
//	                         job: created with a TTL and renewed while the job runs
//	rate.<queue>.<kind>      the earliest time of the kind's next start (Unix nanoseconds, decimal)
//
// An agent takes a slot (create) and the next start (compare-and-set)
// before it starts a job of a limited kind, and waits while it cannot.

// KindLimit caps a kind across the whole fleet: at most Concurrency of its
// jobs run at once, and at most Rate start per Period, evenly spaced (one
// start every Period/Rate). Zero means no cap of that sort.
type KindLimit struct {
	Concurrency int    `json:"concurrency,omitempty"`
	Rate        int    `json:"rate,omitempty"`
	Period      string `json:"period,omitempty"` // a Go duration ("1m", "1s"); required with rate
}

// MaxLimitConcurrency bounds a fleet-wide concurrency limit: one slot is
// one key, and a waiting agent reads them all.
const MaxLimitConcurrency = 10000

// LimitSlotTTL is how long a concurrency slot outlives its last renewal: a
// killed agent's slots come free after it. Holders renew every third of it.
const LimitSlotTTL = 15 * time.Second

// ParsedPeriod is the limit's period; zero when it has none.
func (l KindLimit) ParsedPeriod() time.Duration {
	d, _ := time.ParseDuration(l.Period)
	return d
}

// Interval is the spacing of starts under the rate: Period/Rate; zero when
// the kind has no rate.
func (l KindLimit) Interval() time.Duration {
	if l.Rate <= 0 {
		return 0
	}
	return l.ParsedPeriod() / time.Duration(l.Rate)
}

// Validate reports what is wrong with the limit, naming the field.
func (l KindLimit) Validate() error {
	var errs []error
	if l.Concurrency < 0 || l.Concurrency > MaxLimitConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d is out of range 0..%d", l.Concurrency, MaxLimitConcurrency))
	}
	if l.Rate < 0 {
		errs = append(errs, fmt.Errorf("rate %d is negative", l.Rate))
	}
	switch {
	case l.Rate > 0 && l.Period == "":
		errs = append(errs, errors.New("rate needs a period (e.g. \"1m\")"))
	case l.Period != "":
		d, err := time.ParseDuration(l.Period)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("period %q is not a duration (e.g. \"1m\", \"1s\")", l.Period))
		case l.Rate == 0:
			errs = append(errs, fmt.Errorf("period %q without a rate: a rate of zero starts nothing; give rate > 0 or no period", l.Period))
		case d <= 0:
			errs = append(errs, fmt.Errorf("period %q must be positive", l.Period))
		case d/time.Duration(l.Rate) < time.Millisecond:
			errs = append(errs, fmt.Errorf("rate %d per %s spaces starts less than 1ms apart; use concurrency instead", l.Rate, l.Period))
		}
	}
	if l.Concurrency == 0 && l.Rate == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("a limit needs concurrency > 0 or rate > 0 (to lift a limit, delete it)"))
	}
	return errors.Join(errs...)
}

// String is the limit in words: "concurrency 5, rate 100 per 1m0s".
func (l KindLimit) String() string {
	var parts []string
	if l.Concurrency > 0 {
		parts = append(parts, "concurrency "+strconv.Itoa(l.Concurrency))
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("rate %d per %s", l.Rate, l.ParsedPeriod()))
	}
	return strings.Join(parts, ", ")
}

// ParseKindLimit decodes and validates a limit document; unknown fields
// are refused.
func ParseKindLimit(data []byte) (KindLimit, error) {
	var l KindLimit
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return l, fmt.Errorf("limit document: %w", err)
	}
	return l, l.Validate()
}

// LimitDefKey is the key of a kind's limit document.
func LimitDefKey(queue, kind string) string { return "def." + queue + "." + kind }

// LimitSlotKey is the key of a kind's concurrency slot i.
func LimitSlotKey(queue, kind string, i int) string {
	return "slot." + queue + "." + kind + "." + strconv.Itoa(i)
}

// LimitRateKey is the key of a kind's next start.
func LimitRateKey(queue, kind string) string { return "rate." + queue + "." + kind }

// LimitKey is what a key of bucket limits is about: its sort (def, slot
// or rate), queue, kind and, for a slot, its index.
type LimitKey struct {
	Sort, Queue, Kind string
	Slot              int
}

// ParseLimitKey splits a key of bucket limits; ok is false for a key of
// another shape.
func ParseLimitKey(key string) (LimitKey, bool) {
	parts := strings.Split(key, ".")
	switch {
	case len(parts) == 3 && (parts[0] == "def" || parts[0] == "rate"):
		return LimitKey{Sort: parts[0], Queue: parts[1], Kind: parts[2]}, true
	case len(parts) == 4 && parts[0] == "slot":
		i, err := strconv.Atoi(parts[3])
		if err != nil || i < 0 {
			return LimitKey{}, false
		}
		return LimitKey{Sort: "slot", Queue: parts[1], Kind: parts[2], Slot: i}, true
	}
	return LimitKey{}, false
}

// LimitSlot is the value of a taken concurrency slot.
type LimitSlot struct {
	AgentID string `json:"agent_id"`
	JobID   string `json:"job_id"`
}

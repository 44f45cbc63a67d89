package jetfleet

import (
	"context"
	"encoding/json"
	"errors"

	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// KindLimit caps a kind across every agent of the fleet (docs/protocol.md
// §2.4): at most Concurrency of its jobs run at once, and at most Rate
// start per Period, one every Period/Rate. Jobs over the limit wait on the
// agent that holds them (event waiting), spending no attempt.
type KindLimit struct {
	Concurrency int           `json:"concurrency,omitempty"`
	Rate        int           `json:"rate,omitempty"`
	Period      time.Duration `json:"-"`
}

// LimitInfo is a kind's limit and how it is used now.
type LimitInfo struct {
	Queue string    `json:"queue"`
	Kind  string    `json:"kind"`
	Limit KindLimit `json:"limit"`
	// Period is Limit.Period in words ("1m0s"), for JSON.
	Period string `json:"period,omitempty"`
	// Running is how many of the kind's concurrency slots are taken.
	Running int `json:"running"`
	// NextStart is the earliest time the next job of the kind may start
	// under its rate (zero: now, or no rate).
	NextStart time.Time `json:"next_start,omitzero"`
	// Invalid says what is wrong with a stored limit that was not written
	// by this client (jobs of the kind wait until it is fixed).
	Invalid string `json:"invalid,omitempty"`
}

func (l KindLimit) doc() protocol.KindLimit {
	d := protocol.KindLimit{Concurrency: l.Concurrency, Rate: l.Rate}
	if l.Period != 0 || l.Rate != 0 {
		d.Period = l.Period.String()
	}
	return d
}

// SetLimit sets (or replaces) the fleet-wide limit of queue's kind. Agents
// apply it to the jobs they start from then on. An invalid limit (a rate of
// zero with a period, a rate without a period, a negative value) is
// refused with a *protocol.Error of code invalid_argument.
func (c *Client) SetLimit(ctx context.Context, queue, kind string, limit KindLimit) error {
	if err := validNames(queue, kind); err != nil {
		return err
	}
	doc := limit.doc()
	if err := doc.Validate(); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "limit of %s/%s: %v", queue, kind, err)
	}
	kv, err := c.limitsBucket(ctx)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(doc)
	if _, err := kv.Put(ctx, protocol.LimitDefKey(queue, kind), data); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "store the limit of %s/%s: %v", queue, kind, err)
	}
	return nil
}

// DeleteLimit lifts the fleet-wide limit of queue's kind; jobs waiting for
// it start. Deleting a limit that does not exist is an error of code
// not_found.
func (c *Client) DeleteLimit(ctx context.Context, queue, kind string) error {
	if err := validNames(queue, kind); err != nil {
		return err
	}
	kv, err := c.limitsBucket(ctx)
	if err != nil {
		return err
	}
	key := protocol.LimitDefKey(queue, kind)
	if _, err := kv.Get(ctx, key); errors.Is(err, jetstream.ErrKeyNotFound) {
		return protocol.Errorf(protocol.CodeNotFound, "kind %s of queue %s has no fleet-wide limit", kind, queue)
	}
	if err := kv.Delete(ctx, key); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "delete the limit of %s/%s: %v", queue, kind, err)
	}
	return nil
}

// Limits lists every fleet-wide limit with its use, by queue and kind.
func (c *Client) Limits(ctx context.Context) ([]LimitInfo, error) {
	kv, err := c.limitsBucket(ctx)
	if err != nil {
		return nil, err
	}
	entries, err := protocol.ReadBucket(ctx, c.js, kv, ">", true)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "list bucket %s: %v", protocol.BucketLimits, err)
	}
	byKind := map[string]*LimitInfo{}
	slots := map[string]int{}
	var rates []string
	for _, entry := range entries {
		key := entry.Key()
		k, ok := protocol.ParseLimitKey(key)
		if !ok {
			continue
		}
		qk := k.Queue + "." + k.Kind
		switch k.Sort {
		case "slot":
			slots[qk]++
		case "rate":
			rates = append(rates, key)
		case "def":
			info := &LimitInfo{Queue: k.Queue, Kind: k.Kind}
			entry, err := kv.Get(ctx, key)
			if err != nil {
				continue // deleted meanwhile
			}
			doc, err := protocol.ParseKindLimit(entry.Value())
			if err != nil {
				info.Invalid = err.Error()
			}
			info.Limit = KindLimit{Concurrency: doc.Concurrency, Rate: doc.Rate, Period: doc.ParsedPeriod()}
			if doc.Rate > 0 {
				info.Period = info.Limit.Period.String()
			}
			byKind[qk] = info
		}
	}
	for _, key := range rates {
		k, _ := protocol.ParseLimitKey(key)
		info := byKind[k.Queue+"."+k.Kind]
		if info == nil {
			continue
		}
		if entry, err := kv.Get(ctx, key); err == nil {
			if n, err := strconv.ParseInt(string(entry.Value()), 10, 64); err == nil && time.Unix(0, n).After(time.Now()) {
				info.NextStart = time.Unix(0, n).UTC()
			}
		}
	}
	out := make([]LimitInfo, 0, len(byKind))
	for qk, info := range byKind {
		info.Running = slots[qk]
		out = append(out, *info)
	}
	slices.SortFunc(out, func(a, b LimitInfo) int {
		if a.Queue != b.Queue {
			return strings.Compare(a.Queue, b.Queue)
		}
		return strings.Compare(a.Kind, b.Kind)
	})
	return out, nil
}

func validNames(queue, kind string) error {
	if err := protocol.ValidateToken("queue", queue); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	if err := protocol.ValidateToken("kind", kind); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	return nil
}

func (c *Client) limitsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := c.js.KeyValue(ctx, protocol.BucketLimits)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "bucket %s (is the fleet's topology provisioned?): %v", protocol.BucketLimits, err)
	}
	return kv, nil
}

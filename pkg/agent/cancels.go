package agent

import (
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// cancelView mirrors bucket cancels: the cancels requested for jobs that
// were not running (queued, delayed, between attempts). A job delivered
// with a cancel pending is ended as cancelled without running. The bucket's
// TTL (topology.cancel_ttl) bounds what it holds.
type cancelView struct {
	logger *slog.Logger
	// onCancel is told of each cancel stored, so a job that started
	// before its cancel reached the agent ends too.
	onCancel func(storedCancel)

	mu      sync.Mutex
	cancels map[string]storedCancel // by job token
}

// storedCancel is a cancel and when the server stored it: the server's
// clock, the one that stamps job messages, judges which came first.
type storedCancel struct {
	*jetfleetpb.JobCancel
	stored time.Time
}

// appliesTo reports whether the cancel is for the job message with id
// jobID stored at stored: a job id enqueued again after its cancel is
// another job.
func (c storedCancel) appliesTo(jobID string, stored time.Time) bool {
	return c.JobCancel != nil && c.GetJobId() == jobID && !c.stored.Before(stored)
}

func newCancelView(logger *slog.Logger, onCancel func(storedCancel)) *cancelView {
	return &cancelView{logger: logger, onCancel: onCancel, cancels: map[string]storedCancel{}}
}

func (c *cancelView) apply(entry jetstream.KeyValueEntry) {
	if entry.Operation() != jetstream.KeyValuePut {
		c.mu.Lock()
		delete(c.cancels, entry.Key())
		c.mu.Unlock()
		return
	}
	var doc jetfleetpb.JobCancel
	if err := protocol.Unmarshal(entry.Value(), &doc); err != nil {
		c.logger.Warn("unreadable cancel request", "key", entry.Key(), telemetry.LogError, err)
		return
	}
	sc := storedCancel{JobCancel: &doc, stored: entry.Created()}
	c.mu.Lock()
	c.cancels[entry.Key()] = sc
	c.mu.Unlock()
	if c.onCancel != nil {
		c.onCancel(sc)
	}
}

// requested returns the cancel pending for the job message with id jobID
// stored at stored.
func (c *cancelView) requested(jobID string, stored time.Time) (storedCancel, bool) {
	if c == nil {
		return storedCancel{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sc := c.cancels[protocol.JobToken(jobID)]
	return sc, sc.appliesTo(jobID, stored)
}

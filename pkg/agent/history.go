package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// What earlier deliveries of a job message left in its events.

// history is what a job's events say about earlier deliveries of one message.
type history struct {
	// succeeded: an earlier delivery succeeded (its ack was lost).
	succeeded bool
	// dead: the job's dead letter is stored (the TERM after it was lost).
	dead bool
	// cancelled: the job was cancelled (the TERM after it was lost).
	cancelled bool
	// verdict is a failed event whose dead letter is missing.
	verdict *jetfleetpb.JobEvent
	// snoozes counts deliveries that spent no attempt.
	snoozes uint32
	// lastError of the latest failed attempt.
	lastError string
}

// historyTypes are the event types history reads: one direct get each, on
// the type's own subject, so no event arriving out of order can hide one.
var historyTypes = []string{
	protocol.EventSucceeded, protocol.EventSkippedDuplicate, protocol.EventFailed, protocol.EventCancelled,
	protocol.EventDead, protocol.EventSnoozed, protocol.EventReleased, protocol.EventRetrying,
}

// history reads the job's latest event of each kind that matters, keeping
// those about this message (seq).
//
// Each read goes to the leader of EVENTS (protocol.LeaderGetLast), not to
// any replica: a replica back from a partition answers "none" for every
// event stored while it was away, and a job whose earlier delivery
// succeeded would run again (the chaos partition run found such jobs right
// after each heal, when JetStream redelivered what the cut had left
// unacknowledged). A read that gets no answer (EVENTS electing its leader)
// is sent again until historyReadLimit; only then is the redelivery run as
// new — its outcome could not be stored before EVENTS answers anyway.
func (a *Agent) history(ctx context.Context, job *Job, seq uint64) history {
	readCtx, cancel := context.WithTimeout(ctx, historyReadLimit)
	defer cancel()
	latest := make([]*jetfleetpb.JobEvent, len(historyTypes))
	var wg sync.WaitGroup
	for i, typ := range historyTypes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := a.lastEventFromLeader(readCtx, protocol.JobEventSubject(job.Queue, job.Kind, typ, job.ID))
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgNotFound) {
					a.logger.Warn("job events unreadable; treating the redelivery as new", telemetry.LogJobID, job.ID, telemetry.LogError, err)
				}
				return
			}
			var ev jetfleetpb.JobEvent
			if err := protocol.Unmarshal(m.Data, &ev); err != nil || ev.GetStreamSequence() != seq {
				return // undecodable, or about another message with the same job id
			}
			latest[i] = &ev
		}()
	}
	wg.Wait()
	var h history
	var lastFailure time.Time
	for i, ev := range latest {
		if ev == nil {
			continue
		}
		h.snoozes = max(h.snoozes, ev.GetSnoozes())
		switch historyTypes[i] {
		case protocol.EventSucceeded, protocol.EventSkippedDuplicate:
			h.succeeded = true
		case protocol.EventDead:
			h.dead = true
		case protocol.EventCancelled:
			h.cancelled = true
		case protocol.EventFailed:
			if latest[slices.Index(historyTypes, protocol.EventDead)] == nil {
				h.verdict = ev
			}
		}
		if ev.GetError() != "" && ev.GetTime().AsTime().After(lastFailure) {
			lastFailure, h.lastError = ev.GetTime().AsTime(), ev.GetError()
		}
	}
	return h
}

// historyReadLimit bounds how long a redelivery waits for its history; the
// job keeps its message (progress reports) meanwhile. A stream elects its
// leader within 4-9 s.
const historyReadLimit = 20 * time.Second

// lastEventFromLeader reads the last event on subject from the leader of
// EVENTS: an answer (jetstream.ErrMsgNotFound included) or ctx's end. A
// read unanswered within historyReadTry, or refused for want of a leader,
// is sent again.
func (a *Agent) lastEventFromLeader(ctx context.Context, subject string) (protocol.StoredMsg, error) {
	for {
		tryCtx, cancel := context.WithTimeout(ctx, historyReadTry)
		m, err := protocol.LeaderGetLast(tryCtx, a.nc, protocol.StreamEvents, subject)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil {
			return m, err
		}
		select {
		case <-ctx.Done():
			return m, err
		case <-time.After(historyReadPause):
		}
	}
}

// historyReadTry is one read's wait for its answer; historyReadPause the
// pause before the next, when the server said no leader answers.
const (
	historyReadTry   = 3 * time.Second
	historyReadPause = 250 * time.Millisecond
)

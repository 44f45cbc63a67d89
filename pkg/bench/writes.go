package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Store writes per job (issue 22 item 2). With sync_interval: always, a
// single server syncs each write to a stream's store on its own: a stored
// message, and a message removed other than by the stream's limits (the
// tombstone a work-queue ack leaves). Counting them per stream between the
// start and the end of a phase says what each job costs and where:
//
//	JOBS appends           the job itself (and any redelivery's retry)
//	JOBS acks              its removal when the agent acks it
//	EVENTS appends         its events (succeeded; started only past agent.started_event_after)
//	key-value appends      heartbeats, leases, limits, unique keys: shared by every job of the phase
//
// Consumer state (acks recorded in the consumer's own file) is written by
// the server's flusher, not per ack, and is not counted.

// streamTally is a stream's counters at one moment.
type streamTally struct {
	lastSeq uint64
	msgs    uint64
	// ackRemoves: messages leave by acks (work queue, interest), each one a
	// tombstone write; a limits stream drops messages without writing.
	ackRemoves bool
}

func tallyStreams(ctx context.Context, js jetstream.JetStream) (map[string]streamTally, error) {
	out := map[string]streamTally{}
	list := js.ListStreams(ctx)
	for info := range list.Info() {
		out[info.Config.Name] = streamTally{lastSeq: info.State.LastSeq, msgs: info.State.Msgs,
			ackRemoves: info.Config.Retention != jetstream.LimitsPolicy}
	}
	if err := list.Err(); err != nil {
		return nil, fmt.Errorf("tally the streams: %w", err)
	}
	return out, nil
}

// storeWrites are the writes of one phase, per job.
type storeWrites struct {
	jobsAppends, jobsAcks, events, keyValue, other float64
}

func (w storeWrites) total() float64 {
	return w.jobsAppends + w.jobsAcks + w.events + w.keyValue + w.other
}

func (w storeWrites) String() string {
	return fmt.Sprintf("%.2f writes/job (JOBS %.2f + acks %.2f, EVENTS %.2f, key-value %.2f, other %.2f)",
		w.total(), w.jobsAppends, w.jobsAcks, w.events, w.keyValue, w.other)
}

// writesBetween divides the writes between two tallies by the phase's jobs.
func writesBetween(before, after map[string]streamTally, jobs int) storeWrites {
	var w storeWrites
	for name, a := range after {
		b := before[name] // a stream created during the phase starts from zero
		appends := float64(a.lastSeq - b.lastSeq)
		removes := 0.0
		if a.ackRemoves {
			// Every message stored before or during the phase that is gone.
			removes = float64(b.msgs) + appends - float64(a.msgs)
		}
		switch {
		case name == protocol.StreamJobs:
			w.jobsAppends += appends
			w.jobsAcks += removes
		case name == protocol.StreamEvents:
			w.events += appends + removes
		case strings.HasPrefix(name, "KV_"):
			w.keyValue += appends + removes
		default:
			w.other += appends + removes
		}
	}
	n := float64(jobs)
	return storeWrites{jobsAppends: w.jobsAppends / n, jobsAcks: w.jobsAcks / n, events: w.events / n,
		keyValue: w.keyValue / n, other: w.other / n}
}

// phaseTally is the streams' tally at the start of a phase; nil when the
// run does not count writes.
type phaseTally struct {
	js     jetstream.JetStream
	before map[string]streamTally
}

func (tp *throughputRun) tally(ctx context.Context, js jetstream.JetStream) (*phaseTally, error) {
	if !tp.countWrites {
		return nil, nil
	}
	before, err := tallyStreams(ctx, js)
	if err != nil {
		return nil, err
	}
	return &phaseTally{js: js, before: before}, nil
}

// writes are the writes per job since the tally; zero when not counting.
func (t *phaseTally) writes(ctx context.Context, jobs int) (storeWrites, error) {
	if t == nil {
		return storeWrites{}, nil
	}
	after, err := tallyStreams(ctx, t.js)
	if err != nil {
		return storeWrites{}, err
	}
	return writesBetween(t.before, after, jobs), nil
}

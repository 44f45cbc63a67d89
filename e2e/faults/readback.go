package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// What jetfleet stored, read back at the end of a scenario.

// supervisorStream and historyKindSubjects: docs/protocol.md §7.6. Only
// the per-kind subjects are counted: a scheduled run also has a record on
// its schedule's subject.
const (
	supervisorStream    = "SUPERVISOR"
	supervisorConsumer  = "supervisor"
	historyKindSubjects = "jetfleet.supervisor.history.kind.>"
)

// letter is one dead letter in DLQ: the job it is about (its id, and its
// sequence in JOBS), why, and the error code.
type letter struct {
	jobID, kind, reason, code string
	originalSeq               uint64
}

type storedJobEvent struct {
	ev     *jetfleetpb.JobEvent
	stored time.Time
}

type storedScheduleEvent struct {
	ev     *jetfleetpb.ScheduleEvent
	stored time.Time
}

// queuedJob is a message still in JOBS.
type queuedJob struct {
	seq            uint64
	subject, jobID string
}

// consumerState is a queue consumer of JOBS as `jetfleet status` shows it.
type consumerState struct {
	name                string
	filters             []string
	pending, ackPending uint64
}

// snapshot is everything read back.
type snapshot struct {
	effects        *effects
	letters        []letter
	jobEvents      []storedJobEvent
	scheduleEvents []storedScheduleEvent
	history        []*jetfleetpb.Execution
	queued         []queuedJob
	consumers      []consumerState
}

// snapshot reads the effect files and the streams.
func (f *fleet) snapshot(ctx context.Context) (*snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s := &snapshot{}
	var err error
	if s.effects, err = readEffects(f.effectsDir()); err != nil {
		return nil, fmt.Errorf("effect files: %w", err)
	}
	if s.letters, err = f.letters(ctx); err != nil {
		return nil, err
	}
	err = readStream(ctx, f.js, protocol.StreamEvents, []string{protocol.JobEventsSubjects, protocol.ScheduleEventsSubjects},
		func(m jetstream.Msg) error {
			md, _ := m.Metadata()
			if strings.HasPrefix(m.Subject(), "events.job.") {
				var ev jetfleetpb.JobEvent
				if err := protocol.Unmarshal(m.Data(), &ev); err != nil {
					return err
				}
				s.jobEvents = append(s.jobEvents, storedJobEvent{ev: &ev, stored: md.Timestamp})
				return nil
			}
			var ev jetfleetpb.ScheduleEvent
			if err := protocol.Unmarshal(m.Data(), &ev); err != nil {
				return err
			}
			s.scheduleEvents = append(s.scheduleEvents, storedScheduleEvent{ev: &ev, stored: md.Timestamp})
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", protocol.StreamEvents, err)
	}
	err = readStream(ctx, f.js, supervisorStream, []string{historyKindSubjects}, func(m jetstream.Msg) error {
		var x jetfleetpb.Execution
		if err := protocol.Unmarshal(m.Data(), &x); err != nil {
			return err
		}
		s.history = append(s.history, &x)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", supervisorStream, err)
	}
	if s.queued, err = f.queuedJobs(ctx); err != nil {
		return nil, err
	}
	if s.consumers, err = f.queueConsumers(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// letters reads every dead letter in DLQ.
func (f *fleet) letters(ctx context.Context) ([]letter, error) {
	var out []letter
	err := readStream(ctx, f.js, protocol.StreamDLQ, nil, func(m jetstream.Msg) error {
		var dl jetfleetpb.DeadLetter
		if err := protocol.Unmarshal(m.Data(), &dl); err != nil {
			return err
		}
		out = append(out, letter{jobID: dl.GetJobId(), kind: dl.GetKind(), reason: dl.GetReason(),
			code: dl.GetErrorCode(), originalSeq: dl.GetOriginalSequence()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", protocol.StreamDLQ, err)
	}
	return out, nil
}

// readStream calls fn for every message of stream on filters (nil: all),
// in order, up to the last one stored when the read began or later.
func readStream(ctx context.Context, js jetstream.JetStream, stream string, filters []string, fn func(jetstream.Msg) error) error {
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubjects: filters, AckPolicy: jetstream.AckNonePolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute, MemoryStorage: true,
	})
	if err != nil {
		return err
	}
	defer func() {
		delCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(delCtx, stream, cons.CachedInfo().Name)
	}()
	if cons.CachedInfo().NumPending == 0 {
		return nil
	}
	for {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if err := fn(m); err != nil {
				return fmt.Errorf("message on %s: %w", m.Subject(), err)
			}
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				return nil // the last one; the fetch would wait for more
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return err
		}
		if n == 0 {
			return errors.New("no message within 5s although some are pending")
		}
	}
}

// queuedJobs lists the messages still in JOBS (a work-queue stream: acked
// and terminated jobs are gone).
func (f *fleet) queuedJobs(ctx context.Context) ([]queuedJob, error) {
	stream, err := f.js.Stream(ctx, protocol.StreamJobs)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []queuedJob
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(protocol.JobsSubjects))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("JOBS message at or after %d: %w", seq, err)
		}
		out = append(out, queuedJob{seq: m.Sequence, subject: m.Subject, jobID: m.Header.Get(protocol.HeaderJobID)})
		seq = m.Sequence
	}
	return out, nil
}

// queueConsumers lists the consumers of JOBS with their pending counts.
func (f *fleet) queueConsumers(ctx context.Context) ([]consumerState, error) {
	stream, err := f.js.Stream(ctx, protocol.StreamJobs)
	if err != nil {
		return nil, err
	}
	var out []consumerState
	lister := stream.ListConsumers(ctx)
	for info := range lister.Info() {
		filters := info.Config.FilterSubjects
		if info.Config.FilterSubject != "" {
			filters = append(filters, info.Config.FilterSubject)
		}
		out = append(out, consumerState{name: info.Name, filters: filters, pending: info.NumPending, ackPending: uint64(info.NumAckPending)})
	}
	return out, lister.Err()
}

// jobsInStream is how many messages JOBS holds.
func (f *fleet) jobsInStream(ctx context.Context) (uint64, error) {
	stream, err := f.js.Stream(ctx, protocol.StreamJobs)
	if err != nil {
		return 0, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// historyCaughtUp reports whether the supervisor has handled every stored
// event (its durable consumer on EVENTS has nothing pending or unacked).
func (f *fleet) historyCaughtUp(ctx context.Context) (bool, error) {
	cons, err := f.js.Consumer(ctx, protocol.StreamEvents, supervisorConsumer)
	if err != nil {
		return false, err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

// settle waits, at most timeout, until JOBS holds at most keep messages,
// then until the supervisor's history has caught up with the events. It
// reports what it waited for when that did not happen; the scenario then
// counts what it finds.
func (f *fleet) settle(ctx context.Context, keep uint64, timeout time.Duration) []string {
	var notes []string
	start := time.Now()
	if err := waitFor(ctx, timeout, func(ctx context.Context) (bool, error) {
		n, err := f.jobsInStream(ctx)
		return n <= keep, err
	}); err != nil {
		n, _ := f.jobsInStream(ctx)
		notes = append(notes, fmt.Sprintf("JOBS still held %d messages after %s", n, timeout))
	}
	if err := waitFor(ctx, max(timeout-time.Since(start), 30*time.Second), f.historyCaughtUp); err != nil {
		notes = append(notes, "the supervisor's history had not caught up with EVENTS: "+err.Error())
	}
	return notes
}

// waitFor polls cond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := cond(callCtx)
		callCancel()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
			}
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

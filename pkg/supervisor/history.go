package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// history writes one compact Execution record per finished run (a
// succeeded or dead event) on the subject of its kind and, for scheduled
// runs, of its schedule, in stream SUPERVISOR whose per-subject limit keeps
// the last history_size of each. Each record carries the subject's count
// of dead runs in a row, so the leader needs no other state to auto-pause
// a schedule. Only the leader writes; it caches the last record per subject.
//
// Records are published without waiting for each ack, so when some of a
// batch fail, later ones may still be stored: a subject can miss a record
// older than its newest. Events are then read again (the EVENTS consumer
// is rewound), and record finds, for an event older than the newest record,
// whether that very event was recorded and which record precedes it.
type history struct {
	s *Supervisor

	mu   sync.Mutex
	last map[string]*jetfleetpb.Execution
	// kept holds, for subjects where an event older than the newest record
	// was read again, the records the subject keeps, oldest event first.
	kept    map[string][]*jetfleetpb.Execution
	futures []jetstream.PubAckFuture
}

func newHistory(s *Supervisor) *history {
	return &history{s: s, last: map[string]*jetfleetpb.Execution{}, kept: map[string][]*jetfleetpb.Execution{}}
}

func (h *history) reset() {
	h.mu.Lock()
	h.last = map[string]*jetfleetpb.Execution{}
	h.kept = map[string][]*jetfleetpb.Execution{}
	h.futures = nil
	h.mu.Unlock()
}

// record writes the records of a finished run whose event is at eventSeq
// in EVENTS, and returns the schedule's record (nil for unscheduled jobs).
// An event recorded before (read again after a failure or a leader change)
// is not recorded again.
func (h *history) record(ctx context.Context, ev *jetfleetpb.JobEvent, eventSeq uint64) (*jetfleetpb.Execution, error) {
	rec := &jetfleetpb.Execution{
		JobId: ev.GetJobId(), Queue: ev.GetQueue(), Kind: ev.GetKind(), ScheduleId: ev.GetScheduleId(), Status: ev.GetType(),
		Attempts: ev.GetAttempt(), Duration: ev.GetDuration(), AgentId: ev.GetAgentId(), Error: ev.GetError(),
		ErrorCode: ev.GetErrorCode(), TraceId: ev.GetTraceId(), StartedAt: ev.GetStartedAt(), FinishedAt: ev.GetTime(),
		NominalTime: ev.GetNominalTime(), StreamSequence: ev.GetStreamSequence(), EventSequence: eventSeq,
	}
	if ev.GetType() == protocol.EventDead || ev.GetType() == protocol.EventCancelled {
		rec.Reason = ev.GetReason()
	}
	subjects := []string{protocol.HistoryKindSubject(ev.GetQueue(), ev.GetKind())}
	if id := ev.GetScheduleId(); id != "" && protocol.ValidateToken("schedule id", id) == nil {
		subjects = append(subjects, protocol.HistoryScheduleSubject(id))
	}
	var sched *jetfleetpb.Execution
	for i, subject := range subjects {
		prev, recorded, err := h.predecessor(ctx, subject, eventSeq)
		if err != nil {
			return nil, err
		}
		if recorded != nil || prev == skipRecord {
			if i == 1 {
				sched = recorded
			}
			continue
		}
		r := proto.Clone(rec).(*jetfleetpb.Execution)
		switch r.GetStatus() {
		case protocol.EventDead:
			r.ConsecutiveFailures = prev.GetConsecutiveFailures() + 1
		case protocol.EventCancelled:
			r.ConsecutiveFailures = prev.GetConsecutiveFailures() // a cancel is no failure, nor a success
		}
		data, err := protocol.Marshal(r)
		if err != nil {
			return nil, err
		}
		f, err := h.s.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data,
			Header: nats.Header{protocol.HeaderMsgID: {fmt.Sprintf("history:%d:%d", eventSeq, i)}}})
		if err != nil {
			return nil, err
		}
		h.mu.Lock()
		h.futures = append(h.futures, f)
		h.rememberLocked(subject, r)
		h.mu.Unlock()
		if i == 1 {
			sched = r
		}
	}
	return sched, nil
}

// skipRecord is the predecessor of an event older than every record its
// subject keeps: it needs no record, the subject's limit would drop it.
var skipRecord = &jetfleetpb.Execution{}

// predecessor returns the record that precedes the event at eventSeq on
// subject (nil when none), or the event's own record when it has one.
func (h *history) predecessor(ctx context.Context, subject string, eventSeq uint64) (prev, recorded *jetfleetpb.Execution, err error) {
	last, err := h.lastFor(ctx, subject)
	switch {
	case err != nil:
		return nil, nil, err
	case last == nil || last.GetEventSequence() < eventSeq:
		return last, nil, nil // in order: the usual case
	case last.GetEventSequence() == eventSeq:
		return nil, last, nil
	}
	// An event older than the newest record, read again: look among the
	// records the subject keeps (read once, then kept up to date).
	h.mu.Lock()
	_, ok := h.kept[subject]
	h.mu.Unlock()
	if !ok {
		rctx, cancel := h.s.requestCtx(ctx)
		loaded, err := h.s.readHistory(rctx, subject, 0)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		slices.Reverse(loaded) // oldest event first
		h.mu.Lock()
		if _, ok := h.kept[subject]; !ok {
			h.kept[subject] = loaded
		}
		h.mu.Unlock()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := h.kept[subject]
	i := sort.Search(len(recs), func(i int) bool { return recs[i].GetEventSequence() >= eventSeq })
	switch {
	case i < len(recs) && recs[i].GetEventSequence() == eventSeq:
		return nil, recs[i], nil
	case i == 0 && len(recs) >= h.s.cfg.HistorySize:
		return skipRecord, nil, nil
	case i == 0:
		return nil, nil, nil
	}
	return recs[i-1], nil, nil
}

// rememberLocked caches r, just written on subject.
func (h *history) rememberLocked(subject string, r *jetfleetpb.Execution) {
	if cur := h.last[subject]; cur == nil || r.GetEventSequence() > cur.GetEventSequence() {
		h.last[subject] = r
	}
	if recs, ok := h.kept[subject]; ok {
		i := sort.Search(len(recs), func(i int) bool { return recs[i].GetEventSequence() >= r.GetEventSequence() })
		h.kept[subject] = slices.Insert(recs, i, r)
	}
}

// lastFor is the latest record on subject, from the cache or the stream.
func (h *history) lastFor(ctx context.Context, subject string) (*jetfleetpb.Execution, error) {
	h.mu.Lock()
	r, ok := h.last[subject]
	h.mu.Unlock()
	if ok {
		return r, nil
	}
	rctx, cancel := h.s.requestCtx(ctx)
	defer cancel()
	m, err := h.s.store.GetLastMsgForSubject(rctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec jetfleetpb.Execution
	if err := protocol.Unmarshal(m.Data, &rec); err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.last[subject] = &rec
	h.mu.Unlock()
	return &rec, nil
}

// flush waits until the records written so far are stored. On failure the
// cache is dropped, so the next records read what the stream holds.
func (h *history) flush(ctx context.Context) error {
	h.mu.Lock()
	futures := h.futures
	h.futures = nil
	h.mu.Unlock()
	var errs []error
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs = append(errs, err)
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
		if len(errs) > 0 {
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.reset()
		return err
	}
	return nil
}

// readHistory reads the records on subject filter, newest first.
func (s *Supervisor) readHistory(ctx context.Context, filter string, limit int) ([]*jetfleetpb.Execution, error) {
	info, err := s.store.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []*jetfleetpb.Execution
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; {
		m, err := s.store.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		var rec jetfleetpb.Execution
		if err := protocol.Unmarshal(m.Data, &rec); err == nil {
			out = append(out, &rec)
		}
		seq = m.Sequence + 1
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].GetEventSequence() > out[j].GetEventSequence() })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// statsOf aggregates executions given newest first.
func statsOf(recs []*jetfleetpb.Execution) jetfleet.HistoryStats {
	st := jetfleet.HistoryStats{Executions: len(recs)}
	var durations []time.Duration
	counting := true
	for _, r := range recs {
		switch r.GetStatus() {
		case protocol.EventSucceeded:
			st.Succeeded++
			counting = false
		case protocol.EventDead:
			st.Dead++
			if counting {
				st.ConsecutiveFailures++
			}
		case protocol.EventCancelled:
			st.Cancelled++ // neither a success nor a failure: the streak goes on
		}
		if r.GetDuration() != nil {
			durations = append(durations, r.GetDuration().AsDuration())
		}
	}
	if ended := st.Succeeded + st.Dead; ended > 0 {
		st.SuccessRate = float64(st.Succeeded) / float64(ended)
	}
	slices.Sort(durations)
	st.P50, st.P95 = percentile(durations, 0.50), percentile(durations, 0.95)
	return st
}

// percentile of sorted values, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

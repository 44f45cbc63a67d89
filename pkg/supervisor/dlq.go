package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func replaySubject(dlqSeq uint64) string {
	return "jetfleet.supervisor.replays." + strconv.FormatUint(dlqSeq, 10)
}

// maxScan bounds the letters one listing request reads.
const maxScan = 20_000

// listDLQ returns up to limit letters matching f with a sequence above
// after, oldest first, and the after of the next page (0 on the last).
func (s *Supervisor) listDLQ(ctx context.Context, f jetfleet.DLQFilter, after uint64, limit int, withDocs bool) ([]jetfleet.DeadLetterEntry, uint64, error) {
	info, err := s.dlq.Info(ctx)
	if err != nil {
		return nil, 0, err
	}
	if info.State.Msgs == 0 {
		return nil, 0, nil
	}
	seq := max(after+1, info.State.FirstSeq)
	if !f.Since.IsZero() {
		from, err := s.firstAtOrAfter(ctx, info.State.FirstSeq, info.State.LastSeq, f.Since)
		if err != nil {
			return nil, 0, err
		}
		seq = max(seq, from)
	}
	var out []jetfleet.DeadLetterEntry
	filter := f.Subject()
	for scanned := 0; seq <= info.State.LastSeq; scanned++ {
		if scanned >= maxScan || len(out) >= limit {
			return out, seq - 1, nil
		}
		m, err := s.dlq.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
		seq = m.Sequence + 1
		if !f.Until.IsZero() && m.Time.After(f.Until) {
			break
		}
		if f.Reason != "" && m.Header.Get(protocol.HeaderDeadReason) != f.Reason {
			continue
		}
		if f.JobID != "" && m.Header.Get(protocol.HeaderJobID) != f.JobID {
			continue
		}
		e, err := s.entryOf(ctx, m, withDocs)
		if err != nil {
			continue // undecodable letters are listed by no filter
		}
		out = append(out, *e)
	}
	return out, 0, nil
}

func (s *Supervisor) entryOf(ctx context.Context, m *jetstream.RawStreamMsg, withDoc bool) (*jetfleet.DeadLetterEntry, error) {
	var dl jetfleetpb.DeadLetter
	if err := protocol.Unmarshal(m.Data, &dl); err != nil {
		return nil, err
	}
	e := &jetfleet.DeadLetterEntry{Sequence: m.Sequence, Time: m.Time, JobID: dl.GetJobId(), Queue: dl.GetQueue(), Kind: dl.GetKind(),
		Reason: dl.GetReason(), Attempts: dl.GetAttempts(), LastError: firstLine(dl.GetLastError()), ErrorCode: dl.GetErrorCode(),
		AgentID: dl.GetAgentId(), OriginalSubject: dl.GetOriginalSubject(), OriginalSequence: dl.GetOriginalSequence()}
	if withDoc {
		e.Letter = json.RawMessage(m.Data)
	}
	marker, err := s.replayMarker(ctx, m.Sequence)
	if err != nil {
		return nil, err
	}
	e.Replay = marker
	return e, nil
}

// firstAtOrAfter finds the first sequence of the DLQ stream stored at or
// after t, by binary search (stream times are monotonic).
func (s *Supervisor) firstAtOrAfter(ctx context.Context, lo, hi uint64, t time.Time) (uint64, error) {
	ans := hi + 1
	for lo <= hi {
		mid := lo + (hi-lo)/2
		m, err := s.dlq.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(protocol.DLQSubjects))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid - 1 // nothing at or after mid
			if mid == 0 {
				break
			}
			continue
		}
		if err != nil {
			return 0, err
		}
		if !m.Time.Before(t) {
			ans = min(ans, m.Sequence)
			if mid == 0 {
				break
			}
			hi = mid - 1
		} else {
			lo = m.Sequence + 1
		}
	}
	return ans, nil
}

func (s *Supervisor) replayMarker(ctx context.Context, dlqSeq uint64) (*jetfleet.ReplayMarker, error) {
	m, err := s.store.GetLastMsgForSubject(ctx, replaySubject(dlqSeq))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r jetfleet.ReplayMarker
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, nil //nolint:nilerr // an unreadable marker counts as no marker
	}
	return &r, nil
}

// getDLQ returns one letter with its document.
func (s *Supervisor) getDLQ(ctx context.Context, seq uint64) (*jetfleet.DeadLetterEntry, error) {
	m, err := s.dlq.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, &protocol.Error{Code: protocol.CodeNotFound, Field: "sequence", Message: fmt.Sprintf("no dead letter %d", seq)}
	}
	if err != nil {
		return nil, internal(err)
	}
	e, err := s.entryOf(ctx, m, true)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "dead letter %d: %v", seq, err)
	}
	return e, nil
}

// replay republishes one dead letter to its original subject as a new job
// message: the original payload and headers, the same job id, a fresh
// attempt count (it is a new message), Jetfleet-Replayed-From: DLQ:<seq>
// and Nats-Msg-Id replay:DLQ:<seq> (replay:DLQ:<seq>:<n> for the n-th
// forced replay), so a replay is never mistaken for the original and a
// repeated request replays once. A letter replayed before is only
// replayed again with force.
func (s *Supervisor) replay(ctx context.Context, seq uint64, force bool) (*jetfleet.ReplayResult, error) {
	m, err := s.dlq.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, &protocol.Error{Code: protocol.CodeNotFound, Field: "sequence", Message: fmt.Sprintf("no dead letter %d", seq)}
	}
	if err != nil {
		return nil, internal(err)
	}
	var dl jetfleetpb.DeadLetter
	if err := protocol.Unmarshal(m.Data, &dl); err != nil {
		return nil, protocol.Errorf(protocol.CodeInternal, "dead letter %d: %v", seq, err)
	}
	res := &jetfleet.ReplayResult{DLQSequence: seq, JobID: dl.GetJobId()}
	marker, err := s.replayMarker(ctx, seq)
	if err != nil {
		return nil, internal(err)
	}
	if marker != nil && !force {
		res.JobSequence, res.AlreadyReplayed = marker.JobSequence, true
		return res, nil
	}
	if _, _, err := protocol.ParseJobSubject(dl.GetOriginalSubject()); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "dead letter %d cannot be replayed: %v", seq, err)
	}
	count := 1
	if marker != nil {
		count = marker.Count + 1
	}
	h := nats.Header{}
	for k, v := range protocol.HeadersFromDoc(dl.GetHeaders()) {
		if strings.HasPrefix(k, "Nats-") {
			continue // JetStream's own headers: a fresh Nats-Msg-Id, no expectations
		}
		h[k] = v
	}
	from := protocol.StreamDLQ + ":" + strconv.FormatUint(seq, 10)
	h.Set(protocol.HeaderReplayedFrom, from)
	sctx, span := s.jobSpan(ctx, "supervisor.replay", h, append(jobAttrs(dl.GetJobId(), dl.GetQueue(), dl.GetKind(), dl.GetOriginalSequence()),
		attribute.Int64("jetfleet.dlq_sequence", int64(seq)))...)
	defer span.End()
	telemetry.Inject(sctx, h) // the replayed run continues the trace under the replay
	msgID := "replay:" + from
	if count > 1 {
		msgID += ":" + strconv.Itoa(count)
	}
	h.Set(protocol.HeaderMsgID, msgID)
	if dl.GetJobId() != "" && protocol.ValidateJobID(dl.GetJobId()) == nil {
		h.Set(protocol.HeaderJobID, dl.GetJobId()) // keep the identity, even a fallback one
	}
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: dl.GetOriginalSubject(), Header: h, Data: dl.GetPayload()})
	if err != nil {
		return nil, internal(fmt.Errorf("republish dead letter %d: %w", seq, err))
	}
	res.JobSequence = ack.Sequence
	data, _ := json.Marshal(jetfleet.ReplayMarker{DLQSequence: seq, At: s.clk.Now().UTC(), JobSequence: ack.Sequence, Count: count})
	if _, err := s.js.Publish(ctx, replaySubject(seq), data); err != nil {
		return nil, internal(fmt.Errorf("record replay of dead letter %d: %w", seq, err))
	}
	return res, nil
}

// purgeDLQ deletes one letter (seq), the letters matching f, or all of
// them, and returns how many it deleted.
func (s *Supervisor) purgeDLQ(ctx context.Context, seq uint64, f jetfleet.DLQFilter, all bool) (int, error) {
	if seq > 0 {
		err := s.dlq.DeleteMsg(ctx, seq)
		if err != nil {
			if _, gerr := s.dlq.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
				return 0, nil // gone already
			}
			return 0, internal(err)
		}
		return 1, nil
	}
	if all && f.Empty() {
		info, err := s.dlq.Info(ctx)
		if err != nil {
			return 0, internal(err)
		}
		if err := s.dlq.Purge(ctx); err != nil {
			return 0, internal(err)
		}
		return int(info.State.Msgs), nil
	}
	n := 0
	var after uint64
	for {
		page, next, err := s.listDLQ(ctx, f, after, 1000, false)
		if err != nil {
			return n, internal(err)
		}
		for _, e := range page {
			err := s.dlq.DeleteMsg(ctx, e.Sequence)
			switch {
			case err == nil:
				n++
			case errors.Is(err, jetstream.ErrMsgNotFound):
				// gone already (a concurrent purge)
			default:
				if _, gerr := s.dlq.GetMsg(ctx, e.Sequence); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
					return n, internal(fmt.Errorf("delete dead letter %d: %w", e.Sequence, err))
				}
			}
		}
		if next == 0 {
			return n, nil
		}
		after = next
	}
}

package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// advisory is the part of the JetStream consumer advisories the supervisor
// reads: io.nats.jetstream.advisory.v1.max_deliver (JSConsumerDeliveryExceededAdvisory)
// and io.nats.jetstream.advisory.v1.terminated (JSConsumerDeliveryTerminatedAdvisory).
type advisory struct {
	Type       string `json:"type"`
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason,omitempty"`
}

// consume runs handle on batches of the leader's durable consumer on stream
// while ctx lasts. handle acks what it handled.
func (s *Supervisor) consume(ctx context.Context, stream string, batch int, handle func(context.Context, []jetstream.Msg)) {
	var cons jetstream.Consumer
	for ctx.Err() == nil {
		var err error
		rctx, cancel := s.requestCtx(ctx)
		cons, err = s.js.Consumer(rctx, stream, ConsumerName)
		cancel()
		if err == nil {
			break
		}
		s.log.Warn("leader cannot bind its consumer; retrying", "stream", stream, telemetry.LogError, err)
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
	for ctx.Err() == nil {
		msgs, err := fetchBatch(cons, batch)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("fetch failed; retrying", "stream", stream, telemetry.LogError, err)
				sleepCtx(ctx, time.Second)
			}
			continue
		}
		if len(msgs) > 0 {
			handle(ctx, msgs)
		}
	}
}

// fetchBatch takes up to batch messages: those already there at once;
// when there are none, it waits up to a second for the first and takes
// what arrived with it. A batch never waits to fill up, so a lone event
// (a workflow step's end, a dead letter) is handled within milliseconds,
// and a busy stream still comes in full batches.
func fetchBatch(cons jetstream.Consumer, batch int) ([]jetstream.Msg, error) {
	msgs, err := drain(cons.FetchNoWait(batch))
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	if msgs, err = drain(cons.Fetch(1, jetstream.FetchMaxWait(time.Second))); err != nil || len(msgs) == 0 || batch == 1 {
		return msgs, err
	}
	rest, err := drain(cons.FetchNoWait(batch - 1))
	if err != nil {
		return msgs, nil //nolint:nilerr // the first is handled; the rest come with the next fetch
	}
	return append(msgs, rest...), nil
}

func drain(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	// Messages received are handled whatever ended the batch after them.
	if err := b.Error(); len(msgs) == 0 && err != nil && !errors.Is(err, jetstream.ErrNoMessages) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return nil, err
	}
	return msgs, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// consumeAdvisories handles each captured advisory once: MAX_DELIVERIES
// dead-letters the job (GetMsg → DLQ → DeleteMsg → dead event); a
// TERMINATED advisory for a message still in the work stream dead-letters
// it with reason terminated, and is a no-op for one already gone (the
// agent dead-lettered it before its TERM). An advisory is acked only once
// handled, so a leader that dies midway leaves it to the next one, which
// finds the steps already done.
func (s *Supervisor) consumeAdvisories(ctx context.Context) {
	s.consume(ctx, protocol.StreamAdvisories, 64, func(ctx context.Context, msgs []jetstream.Msg) {
		for _, m := range msgs {
			if err := s.handleAdvisory(ctx, m.Subject(), m.Data()); err != nil {
				s.log.Warn("advisory not handled; it will be tried again", "subject", m.Subject(), telemetry.LogError, err)
				_ = m.NakWithDelay(time.Second)
				continue
			}
			_ = m.Ack()
		}
	})
}

func (s *Supervisor) handleAdvisory(ctx context.Context, subject string, data []byte) error {
	var adv advisory
	if err := json.Unmarshal(data, &adv); err != nil {
		s.log.Warn("unreadable advisory; dropped", "subject", subject, telemetry.LogError, err)
		return nil
	}
	if adv.Stream != protocol.StreamJobs || adv.StreamSeq == 0 {
		return nil
	}
	switch {
	case strings.HasPrefix(subject, "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."):
		_, err := s.deadLetterSeq(ctx, adv.StreamSeq, protocol.ReasonMaxDeliveries, adv.Deliveries,
			fmt.Sprintf("delivered %d times by consumer %s without an answer (max_deliver)", adv.Deliveries, adv.Consumer))
		return err
	case strings.HasPrefix(subject, "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."):
		_, err := s.deadLetterSeq(ctx, adv.StreamSeq, protocol.ReasonTerminated, adv.Deliveries,
			"terminated without a dead letter: "+adv.Reason)
		return err
	}
	return nil
}

// reconcileLoop runs reconcile when leadership begins and every
// reconcile_interval while it lasts.
func (s *Supervisor) reconcileLoop(ctx context.Context) {
	timer := s.clk.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		if n, err := s.reconcile(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("reconciliation of max deliveries failed", telemetry.LogError, err)
		} else if n > 0 {
			s.log.Warn("dead-lettered jobs past max_deliver that no advisory covered", "jobs", n)
		}
		timer.Reset(s.cfg.ReconcileInterval)
	}
}

// reconcile dead-letters job messages that reached their consumer's
// max_deliver without an advisory being handled (the advisory is a core
// NATS message: it is lost when ADVISORIES did not store it). Verified on
// nats-server 2.15 (TestReconcileFindsJobsPastMaxDeliverWithoutAdvisory):
// such a message stays in the work-queue stream, is no longer pending on
// its consumer (num_ack_pending excludes it; num_redelivered still counts
// it) and is never delivered again; the consumer's ack floor does not
// move past it. So, per queue consumer, the candidates are the messages
// still in JOBS on its filter at or below its delivered stream sequence:
// each is either pending or past max_deliver, and exactly
// candidates − num_ack_pending are past it. With nothing pending, every
// candidate is one. Otherwise a candidate counts only when no live agent
// holds it and its latest event shows its last allowed delivery settled
// more than AckWait ago; at most candidates − pending are dead-lettered.
func (s *Supervisor) reconcile(ctx context.Context) (int, error) {
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	info, err := s.jobs.Info(rctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	var consumers []*jetstream.ConsumerInfo
	lister := s.jobs.ListConsumers(rctx)
	for ci := range lister.Info() {
		consumers = append(consumers, ci)
	}
	if err := lister.Err(); err != nil {
		return 0, err
	}
	held := s.tracker.heldSequences()
	n := 0
	for _, ci := range consumers {
		if ci.Config.AckPolicy != jetstream.AckExplicitPolicy || ci.Config.MaxDeliver <= 0 || ci.Delivered.Stream < info.State.FirstSeq {
			continue
		}
		done, err := s.reconcileConsumer(ctx, ci, info.State.FirstSeq, held)
		n += done
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// reconcileConsumer reconciles one queue consumer. Each request to the
// server has its own bound: a long stream takes many.
func (s *Supervisor) reconcileConsumer(ctx context.Context, ci *jetstream.ConsumerInfo, first uint64, held map[uint64]bool) (int, error) {
	filters := ci.Config.FilterSubjects
	if ci.Config.FilterSubject != "" {
		filters = append(filters, ci.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{protocol.JobsSubjects}
	}
	var candidates []*jetstream.RawStreamMsg
	for _, filter := range filters {
		for seq := first; seq <= ci.Delivered.Stream; {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			rctx, cancel := s.requestCtx(ctx)
			m, err := s.jobs.GetMsg(rctx, seq, jetstream.WithGetMsgSubject(filter))
			cancel()
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return 0, err
			}
			if m.Sequence > ci.Delivered.Stream {
				break
			}
			m.Data = nil // the subject and headers are enough here; deadLetterSeq reads the message again
			candidates = append(candidates, m)
			seq = m.Sequence + 1
		}
	}
	past := len(candidates) - ci.NumAckPending
	if past <= 0 {
		return 0, nil
	}
	maxDeliver := uint64(ci.Config.MaxDeliver)
	detail := fmt.Sprintf("found by reconciliation: no longer pending on consumer %s after max_deliver %d", ci.Name, maxDeliver)
	n := 0
	for _, m := range candidates {
		if n >= past {
			break
		}
		if held[m.Sequence] {
			continue
		}
		if ci.NumAckPending > 0 && !s.lastDeliverySpent(ctx, m, maxDeliver, ci.Config.AckWait) {
			continue
		}
		done, err := s.deadLetterSeq(ctx, m.Sequence, protocol.ReasonMaxDeliveries, maxDeliver, detail)
		if err != nil {
			return n, err
		}
		if done {
			n++
		}
	}
	return n, nil
}

// lastDeliverySpent reports whether the latest event of the job message m
// shows its last allowed delivery settled more than ackWait ago: it can be
// delivered no more.
func (s *Supervisor) lastDeliverySpent(ctx context.Context, m *jetstream.RawStreamMsg, maxDeliver uint64, ackWait time.Duration) bool {
	job, _ := protocol.ParseJob(m.Subject, m.Header, nil)
	if job.ID == "" {
		job.ID = protocol.FallbackJobID(m.Sequence)
	}
	if job.Queue == "" {
		return false
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	ev, err := s.latestEvent(rctx, job.Queue, job.Kind, job.ID)
	if err != nil || ev == nil || ev.GetStreamSequence() != m.Sequence {
		return false
	}
	return ev.GetDelivered() >= maxDeliver && !protocol.AttemptRunning(ev.GetType()) &&
		s.clk.Now().Sub(ev.GetTime().AsTime()) > ackWait
}

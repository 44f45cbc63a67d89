package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Queues: the supervisor creates the consumers of the queues declared
// under topology.queues when it starts, serves the queue API
// (protocol.APIQueue*) and, leading, dead-letters the jobs no queue
// consumer would ever deliver (sweepUnroutable).

func (s *Supervisor) apiQueues(ctx context.Context, data []byte) (any, error) {
	var req struct{}
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	queues, err := s.queueStatuses(ctx)
	if err != nil {
		return nil, internal(err)
	}
	unroutable, err := topology.UnroutableSubjects(ctx, s.jobs)
	if err != nil {
		return nil, internal(err)
	}
	return &jetfleet.QueuesResponse{Queues: queues, Unroutable: unroutable}, nil
}

func (s *Supervisor) apiQueueAdd(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.QueueAddRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateToken("queue", req.Queue); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err).WithField("queue")
	}
	settings := topology.QueueConfig{AckWait: req.AckWait, MaxDeliver: req.MaxDeliver, MaxAckPending: req.MaxAckPending}
	if err := (topology.Config{Queues: map[string]topology.QueueConfig{req.Queue: settings}}).Validate("queue"); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	custom := settings != topology.QueueConfig{}
	if s.topo.Declared(req.Queue) && custom {
		return nil, protocol.Errorf(protocol.CodeConflict,
			"queue %s is declared under topology.queues in the fleet's configuration: change its settings there", req.Queue).WithField("queue")
	}
	queueSettings := s.topo.Queue(req.Queue)
	if custom {
		queueSettings = settings
	}
	created := false
	for _, p := range protocol.Priorities {
		made, err := s.addQueueConsumer(ctx, topology.PriorityConsumerConfig(req.Queue, p, queueSettings), custom)
		if err != nil {
			return nil, err
		}
		created = created || (made && p == protocol.PriorityDefault)
	}
	st, err := s.queueStatus(ctx, req.Queue)
	if err != nil {
		return nil, internal(err)
	}
	if created {
		s.log.Info("queue created", telemetry.LogQueue, req.Queue, "ack_wait", st.AckWait.String(), "max_deliver", st.MaxDeliver)
	}
	return &jetfleet.QueueAddResponse{Queue: *st, Created: created}, nil
}

// addQueueConsumer creates one consumer of a queue, or, when it exists and
// update is set, brings it to want (keeping a breaker's pause). It reports
// whether it created it.
func (s *Supervisor) addQueueConsumer(ctx context.Context, want jetstream.ConsumerConfig, update bool) (bool, error) {
	_, err := s.js.CreateConsumer(ctx, protocol.StreamJobs, want)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerExists) {
		return false, internal(err)
	}
	cur, err := s.jobs.Consumer(ctx, want.Name)
	if err != nil {
		return false, internal(err)
	}
	have := cur.CachedInfo().Config
	if have.AckPolicy != want.AckPolicy || (have.FilterSubject != want.FilterSubject && have.FilterSubject != protocol.QueueAllSubjects(queueOf(want.Name))) {
		return false, protocol.Errorf(protocol.CodeConflict, "consumer %s exists with filter %q and ack policy %s, not a jetfleet queue",
			want.Name, have.FilterSubject, have.AckPolicy)
	}
	if update || have.FilterSubject != want.FilterSubject {
		want.PauseUntil = have.PauseUntil
		if _, err := s.js.UpdateConsumer(ctx, protocol.StreamJobs, want); err != nil {
			return false, internal(err)
		}
	}
	return false, nil
}

// queueOf is the queue of a queue consumer's name.
func queueOf(consumer string) string {
	queue, _, _ := protocol.ParseQueueConsumer(consumer)
	return queue
}

func (s *Supervisor) apiQueueRemove(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.QueueRemoveRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateToken("queue", req.Queue); err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err).WithField("queue")
	}
	if s.topo.Declared(req.Queue) {
		return nil, protocol.Errorf(protocol.CodeConflict,
			"queue %s is declared under topology.queues in the fleet's configuration, so the supervisor would create it again: remove it there first", req.Queue).WithField("queue")
	}
	st, err := s.queueStatus(ctx, req.Queue)
	if err != nil {
		return nil, err
	}
	jobs := st.Pending + uint64(st.AckPending)
	if jobs > 0 && !req.Force {
		return nil, protocol.Errorf(protocol.CodeConflict,
			"queue %s still holds %d jobs (%d queued, %d running); drain it first, or force the removal: its jobs are then dead-lettered with reason unroutable",
			req.Queue, jobs, st.Pending, st.AckPending)
	}
	for _, p := range protocol.Priorities {
		if err := s.js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.PriorityConsumer(req.Queue, p)); err != nil &&
			!errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, internal(err)
		}
	}
	s.log.Warn("queue removed", telemetry.LogQueue, req.Queue, "jobs", jobs)
	return &jetfleet.QueueRemoveResponse{Queue: req.Queue, Jobs: jobs}, nil
}

// queueStatuses lists every queue of JOBS, sorted by queue: the consumers
// of its priorities added up.
func (s *Supervisor) queueStatuses(ctx context.Context) ([]jetfleet.QueueStatus, error) {
	byQueue := map[string][]*jetstream.ConsumerInfo{}
	lister := s.jobs.ListConsumers(ctx)
	for ci := range lister.Info() {
		if queue, _, ok := protocol.ParseQueueConsumer(ci.Name); ok {
			byQueue[queue] = append(byQueue[queue], ci)
		}
	}
	if err := lister.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		return nil, err
	}
	out := []jetfleet.QueueStatus{}
	for queue, infos := range byQueue {
		if qs, ok := s.statusOf(ctx, queue, infos); ok {
			out = append(out, qs)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out, nil
}

// queueStatus is one queue's status; not_found when it has no consumer.
func (s *Supervisor) queueStatus(ctx context.Context, queue string) (*jetfleet.QueueStatus, error) {
	var infos []*jetstream.ConsumerInfo
	for _, p := range protocol.Priorities {
		cons, err := s.jobs.Consumer(ctx, protocol.PriorityConsumer(queue, p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, internal(err)
		}
		infos = append(infos, cons.CachedInfo())
	}
	qs, ok := s.statusOf(ctx, queue, infos)
	if !ok {
		return nil, protocol.Errorf(protocol.CodeNotFound, "queue %s does not exist", queue).WithField("queue")
	}
	return &qs, nil
}

// statusOf adds up the consumers of queue's priorities; the default one
// gives the settings. ok is false without it.
func (s *Supervisor) statusOf(ctx context.Context, queue string, infos []*jetstream.ConsumerInfo) (jetfleet.QueueStatus, bool) {
	var def *jetstream.ConsumerInfo
	qs := jetfleet.QueueStatus{Queue: queue, Breaker: "closed", Declared: s.topo.Declared(queue)}
	for _, ci := range infos {
		_, p, _ := protocol.ParseQueueConsumer(ci.Name)
		if p == protocol.PriorityDefault {
			def = ci
		} else if ci.NumPending > 0 {
			if qs.PendingByPriority == nil {
				qs.PendingByPriority = map[string]uint64{}
			}
			qs.PendingByPriority[p] = ci.NumPending
		}
		qs.Pending += ci.NumPending
		qs.AckPending += ci.NumAckPending
		qs.Redelivered += ci.NumRedelivered
		qs.Waiting += ci.NumWaiting
	}
	if def == nil {
		return jetfleet.QueueStatus{}, false
	}
	if len(qs.PendingByPriority) > 0 {
		qs.PendingByPriority[protocol.PriorityDefault] = def.NumPending
	}
	ci := def
	qs.AckWait, qs.MaxDeliver, qs.Paused = ci.Config.AckWait, ci.Config.MaxDeliver, ci.Paused
	if ci.Paused && ci.Config.PauseUntil != nil {
		qs.PausedUntil = *ci.Config.PauseUntil
	}
	if open, _ := s.rates.breakerState(queue); open {
		qs.Breaker = "open"
	} else if ci.Paused && s.breakerPaused(ctx, queue) {
		qs.Breaker = "open"
	}
	return qs, true
}

// maxUnroutablePerPass bounds the jobs one pass dead-letters, so a flood of
// them does not hold the leader's loop.
const maxUnroutablePerPass = 1000

// unroutableLoop runs sweepUnroutable while this replica leads.
func (s *Supervisor) unroutableLoop(ctx context.Context) {
	every := min(max(s.cfg.UnroutableAfter/5, 200*time.Millisecond), 2*time.Second)
	timer := s.clk.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		if n, err := s.sweepUnroutable(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot dead-letter unroutable jobs", telemetry.LogError, err)
		} else if n > 0 {
			s.log.Warn("dead-lettered jobs no queue serves", "jobs", n)
		}
		timer.Reset(every)
	}
}

// sweepUnroutable dead-letters the jobs that JOBS accepted but no consumer
// would ever deliver, once they are supervisor.unroutable_after old: on a
// subject that is not jobs.<queue>.<kind> with valid tokens (reason
// invalid_subject), or of a queue without a consumer (reason unroutable).
// The wait leaves time for the queue's consumer to appear (an agent
// starting). It reports how many it dead-lettered.
func (s *Supervisor) sweepUnroutable(ctx context.Context) (int, error) {
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	subjects, err := topology.UnroutableSubjects(rctx, s.jobs)
	if err != nil || len(subjects) == 0 {
		return 0, err
	}
	names := make([]string, 0, len(subjects))
	for subject := range subjects {
		names = append(names, subject)
	}
	sort.Strings(names)
	done := 0
	for _, subject := range names {
		reason, detail := protocol.ReasonUnroutable, ""
		if queue, _, perr := protocol.ParseJobSubject(subject); perr != nil {
			reason, detail = protocol.ReasonInvalidSubject, perr.Error()
		} else {
			detail = fmt.Sprintf("no queue consumer serves queue %s: declare the queue under topology.queues, create it with `jetfleet queue add %s`, or start an agent for it", queue, queue)
		}
		for seq := uint64(1); done < maxUnroutablePerPass; {
			m, err := s.jobs.GetMsg(rctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return done, err
			}
			if s.clk.Now().Sub(m.Time) < s.cfg.UnroutableAfter {
				break // newer ones follow: the next pass
			}
			ok, err := s.deadLetterSeq(ctx, m.Sequence, reason, 0, detail)
			if err != nil {
				return done, err
			}
			if ok {
				done++
			}
			seq = m.Sequence + 1
		}
	}
	return done, nil
}

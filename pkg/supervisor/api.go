package supervisor

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// The request/reply API, served by every replica as the micro service
// protocol.SupervisorService (discoverable with $SRV.INFO): dead-letter
// operations (protocol.APIDLQ*), fleet views (protocol.APIAgents, …) and
// queues (protocol.APIQueue*). Requests and replies are JSON (pkg/jetfleet
// holds their types); an error reply carries the micro error headers and
// an Error document (code, message, retryable, field). Every endpoint is
// safe on any replica: reads come from streams and each replica's view of
// the heartbeats; replays, purges and queue changes are idempotent.

// ServiceVersion is the API's version in $SRV.INFO.
const ServiceVersion = "0.2.0"

func (s *Supervisor) serveAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name: protocol.SupervisorService, Version: ServiceVersion,
		Description: "jetfleet supervisor: dead letters (ls, get, replay, purge), agents, jobs (ls, get, cancel), history, status, queues (ls, add, rm), workflows (add, get, ls, rm, run, runs, retry-failed, cancel)",
		Metadata:    map[string]string{"holder": s.rep.Holder()},
	})
	if err != nil {
		return nil, err
	}
	err = protocol.ServeAPI(svc, s.runner.Context, 6*s.cfg.RequestTimeout, map[string]protocol.APIHandlerFunc{
		protocol.APIDLQList: s.apiDLQList, protocol.APIDLQGet: s.apiDLQGet, protocol.APIDLQReplay: s.apiDLQReplay,
		protocol.APIDLQPurge: s.apiDLQPurge,
		protocol.APIAgents:   s.apiAgents, protocol.APIRunningJobs: s.apiJobs, protocol.APIJobDetail: s.apiJob,
		protocol.APIHistory: s.apiHistory, protocol.APIStatus: s.apiStatus,
		protocol.APIQueueList: s.apiQueues, protocol.APIQueueAdd: s.apiQueueAdd, protocol.APIQueueRemove: s.apiQueueRemove,
		protocol.APIJobList: s.apiJobList, protocol.APITrends: s.apiTrends, protocol.APITrendList: s.apiTrendList,
		protocol.APIJobCancel:   s.apiCancel,
		protocol.APIWorkflowAdd: s.workflows.apiAdd, protocol.APIWorkflowGet: s.workflows.apiGet,
		protocol.APIWorkflowList: s.workflows.apiList, protocol.APIWorkflowRemove: s.workflows.apiRemove,
		protocol.APIWorkflowRuns: s.workflows.apiRuns, protocol.APIWorkflowRunGet: s.workflows.apiRunGet,
		protocol.APIWorkflowRun:         s.workflows.forwarding(opWorkflowRun),
		protocol.APIWorkflowRetryFailed: s.workflows.forwarding(opWorkflowRetryFailed),
		protocol.APIWorkflowCancel:      s.workflows.forwarding(opWorkflowCancel),
	})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

func internal(err error) error { return protocol.AsAPIError(err) }

func (s *Supervisor) apiDLQList(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.DLQListRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Limit <= 0 {
		req.Limit = 100
	}
	req.Limit = min(req.Limit, 1000)
	letters, next, err := s.listDLQ(ctx, req.DLQFilter, req.After, req.Limit, false)
	if err != nil {
		return nil, err
	}
	if letters == nil {
		letters = []jetfleet.DeadLetterEntry{}
	}
	return &jetfleet.DLQListResponse{Letters: letters, Next: next}, nil
}

func (s *Supervisor) apiDLQGet(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.DeadLetterRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if req.Sequence == 0 {
		return nil, protocol.FieldError("sequence", "is required")
	}
	return s.getDLQ(ctx, req.Sequence)
}

func (s *Supervisor) apiDLQReplay(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ReplayRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Sequence > 0 {
		r, err := s.replay(ctx, req.Sequence, req.Force)
		if err != nil {
			return nil, err
		}
		return &jetfleet.ReplayResponse{Results: []jetfleet.ReplayResult{*r}}, nil
	}
	if req.DLQFilter.Empty() && !req.All {
		return nil, protocol.FieldError("all", "set a sequence, a filter, or all")
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 1000
	}
	limit = min(limit, 10_000)
	res := &jetfleet.ReplayResponse{Results: []jetfleet.ReplayResult{}}
	after := req.After
	for {
		page, next, err := s.listDLQ(ctx, req.DLQFilter, after, 1000, false)
		if err != nil {
			return nil, err
		}
		for _, e := range page {
			if !req.Force && e.Replay != nil {
				res.AlreadyReplayed++
				continue
			}
			if len(res.Results) >= limit {
				res.Truncated, res.Next = true, e.Sequence-1
				return res, nil
			}
			r, err := s.replay(ctx, e.Sequence, req.Force)
			switch {
			case err != nil:
				res.Results = append(res.Results, jetfleet.ReplayResult{DLQSequence: e.Sequence, JobID: e.JobID, Error: err.Error()})
			case r.AlreadyReplayed: // replayed meanwhile by another request
				res.AlreadyReplayed++
			default:
				res.Results = append(res.Results, *r)
			}
		}
		if next == 0 {
			return res, nil
		}
		after = next
	}
}

func (s *Supervisor) apiDLQPurge(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.PurgeRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Sequence == 0 && req.DLQFilter.Empty() && !req.All {
		return nil, protocol.FieldError("all", "set a sequence, a filter, or all")
	}
	n, err := s.purgeDLQ(ctx, req.Sequence, req.DLQFilter, req.All)
	if err != nil {
		return nil, err
	}
	return &jetfleet.PurgeResponse{Purged: n}, nil
}

func (s *Supervisor) apiAgents(_ context.Context, data []byte) (any, error) {
	var req struct{}
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	return &jetfleet.AgentsResponse{Agents: s.tracker.snapshot(s.clk.Now())}, nil
}

func (s *Supervisor) apiJobs(_ context.Context, data []byte) (any, error) {
	var req jetfleet.RunningJobsRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	out := []jetfleet.RunningJob{}
	for _, j := range s.tracker.running(s.clk.Now()) {
		if (req.Queue == "" || j.Queue == req.Queue) && (req.Kind == "" || j.Kind == req.Kind) &&
			(req.AgentID == "" || j.AgentID == req.AgentID) {
			out = append(out, j)
		}
	}
	return &jetfleet.RunningJobsResponse{Jobs: out}, nil
}

func (s *Supervisor) apiJob(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.JobDetailRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateJobID(req.JobID); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	if (req.Queue == "") != (req.Kind == "") {
		return nil, protocol.FieldError("kind", "give both queue and kind, or neither")
	}
	res := &jetfleet.JobDetail{JobID: req.JobID}
	ev, seq, err := s.latestEventSeq(ctx, req.Queue, req.Kind, req.JobID)
	if err != nil {
		return nil, internal(err)
	}
	if ev != nil {
		res.Event, _ = protocol.Marshal(ev)
		res.EventSequence = seq
		res.Result = jetfleet.ResultOfEvent(ev)
	}
	for _, j := range s.tracker.running(s.clk.Now()) {
		if j.JobID == req.JobID {
			res.Running = append(res.Running, j)
			if j.Progress != nil && (res.Progress == nil || j.Progress.Time.After(res.Progress.Time)) {
				res.Progress = j.Progress
			}
		}
	}
	if res.Progress == nil {
		// Reported before a heartbeat listed it, or its agent went silent.
		res.Progress = jetfleet.ProgressOfEvent(ev)
	}
	if res.Delayed, err = protocol.LookupDelayed(ctx, s.delayed, req.Queue, req.Kind, req.JobID); err != nil {
		return nil, internal(err)
	}
	if ev == nil && len(res.Running) == 0 && res.Delayed == nil {
		return nil, &protocol.Error{Code: protocol.CodeNotFound, Field: "job_id", Message: fmt.Sprintf("no event of job %q", req.JobID)}
	}
	return res, nil
}

func (s *Supervisor) apiHistory(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.HistoryRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	var filter string
	switch {
	case req.ScheduleID != "" && req.Kind == "":
		if err := protocol.ValidateToken("schedule id", req.ScheduleID); err != nil {
			return nil, protocol.FieldError("schedule_id", "%v", err)
		}
		filter = protocol.HistoryScheduleSubject(req.ScheduleID)
	case req.Kind != "" && req.ScheduleID == "":
		if err := protocol.ValidateToken("kind", req.Kind); err != nil {
			return nil, protocol.FieldError("kind", "%v", err)
		}
		queue := "*"
		if req.Queue != "" {
			if err := protocol.ValidateToken("queue", req.Queue); err != nil {
				return nil, protocol.FieldError("queue", "%v", err)
			}
			queue = req.Queue
		}
		filter = protocol.HistoryKindSubject(queue, req.Kind)
	default:
		return nil, protocol.FieldError("kind", "give a kind or a schedule_id")
	}
	limit := req.Limit
	if limit <= 0 {
		limit = s.cfg.HistorySize
	}
	recs, err := s.readHistory(ctx, filter, limit)
	if err != nil {
		return nil, internal(err)
	}
	res := &jetfleet.HistoryResponse{Executions: make([]json.RawMessage, 0, len(recs)), Stats: statsOf(recs)}
	for _, r := range recs {
		data, err := protocol.Marshal(r)
		if err != nil {
			return nil, internal(err)
		}
		res.Executions = append(res.Executions, data)
	}
	return res, nil
}

func (s *Supervisor) apiStatus(ctx context.Context, data []byte) (any, error) {
	var req struct{}
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	now := s.clk.Now()
	res := &jetfleet.FleetStatus{Replica: s.rep.Holder(), Queues: []jetfleet.QueueStatus{}}
	if lv, err := lease.Read(ctx, s.leases, s.cfg.LeaseKey); err == nil {
		res.Leader = lv.Holder
	}
	for _, a := range s.tracker.snapshot(now) {
		switch a.State {
		case jetfleet.AgentDead:
			res.AgentsDead++
			continue
		case jetfleet.AgentDraining:
			res.AgentsDrain++
		default:
			res.AgentsAlive++
		}
		res.Capacity += a.Capacity
		res.Running += a.Jobs
	}
	queues, err := s.queueStatuses(ctx)
	if err != nil {
		return nil, internal(err)
	}
	res.Queues = queues
	if unroutable, err := topology.UnroutableSubjects(ctx, s.jobs); err == nil {
		for _, n := range unroutable {
			res.Unroutable += n
		}
	}
	if info, err := s.dlq.Info(ctx); err == nil {
		res.DLQDepth = info.State.Msgs
	}
	if cons, err := s.delayed.Consumer(ctx, protocol.DelayedConsumer); err == nil {
		res.Delayed = cons.CachedInfo().NumPending
	}
	for _, j := range s.tracker.running(now) {
		if j.State != "running" {
			res.Attention = append(res.Attention, j)
		}
	}
	return res, nil
}

// breakerPaused reports whether the latest event of a paused queue says its
// breaker paused it (for replicas that do not lead).
func (s *Supervisor) breakerPaused(ctx context.Context, queue string) bool {
	m, err := s.events.GetLastMsgForSubject(ctx, protocol.QueueEventSubject(queue, "*"))
	if err != nil {
		return false
	}
	var ev jetfleetpb.QueueEvent
	return protocol.Unmarshal(m.Data, &ev) == nil && ev.GetType() == protocol.EventBreakerOpened
}

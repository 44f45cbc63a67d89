package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// The request/reply API, served by every replica as the micro service
// ServiceName (discoverable with $SRV.INFO): dead-letter operations on
// DLQAPISubject + ".<endpoint>" and fleet views on APISubject +
// ".<endpoint>". Requests and replies are JSON; an error reply carries the
// micro error headers and an Error document (code, message, retryable,
// field). Every endpoint is safe on any replica: reads come from streams
// and each replica's view of the heartbeats; replays and purges are
// idempotent.
const (
	ServiceName    = "jetfleet-supervisor"
	ServiceVersion = "0.1.0"
	APISubject     = "jetfleet.api.supervisor"
	DLQAPISubject  = "jetfleet.api.dlq"
)

// Endpoints (the last token of their subject).
const (
	EndpointDLQList   = "ls"
	EndpointDLQGet    = "get"
	EndpointDLQReplay = "replay"
	EndpointDLQPurge  = "purge"

	EndpointAgents  = "agents"
	EndpointJobs    = "jobs"
	EndpointJob     = "job"
	EndpointHistory = "history"
	EndpointStatus  = "status"
)

// DLQListRequest pages through dead letters matching a filter, oldest first.
type DLQListRequest struct {
	DLQFilter
	// After is the Next of the previous page.
	After uint64 `json:"after,omitempty"`
	// Limit defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// DLQListResponse is one page; Next is the After of the next page, 0 on the last.
type DLQListResponse struct {
	Letters []DeadLetterEntry `json:"letters"`
	Next    uint64            `json:"next,omitempty"`
}

// SequenceRequest names one dead letter.
type SequenceRequest struct {
	Sequence uint64 `json:"sequence"`
}

// ReplayRequest replays one letter (Sequence), the letters matching the
// filter, or all of them (All with an empty filter).
type ReplayRequest struct {
	Sequence uint64 `json:"sequence,omitempty"`
	DLQFilter
	All bool `json:"all,omitempty"`
	// Force replays letters replayed before once more.
	Force bool `json:"force,omitempty"`
	// Limit bounds how many letters a filtered replay publishes. Letters
	// replayed before (without Force) are skipped and do not count.
	// Defaults to 1000; at most 10000.
	Limit int `json:"limit,omitempty"`
	// After is the Next of the previous response: a filtered replay goes on
	// with the letters above it.
	After uint64 `json:"after,omitempty"`
}

// ReplayResponse lists what was replayed.
type ReplayResponse struct {
	// Results lists each letter replayed, or that failed to be. A replay of
	// one letter (Sequence) lists it even when it was replayed before.
	Results []ReplayResult `json:"results"`
	// AlreadyReplayed counts the letters a filtered replay skipped because
	// they were replayed before.
	AlreadyReplayed int `json:"already_replayed,omitempty"`
	// Truncated is set when more letters matched than Limit; Next is then
	// the After of a request that goes on.
	Truncated bool   `json:"truncated,omitempty"`
	Next      uint64 `json:"next,omitempty"`
}

// PurgeRequest deletes one letter (Sequence), the letters matching the
// filter, or all of them (All with an empty filter).
type PurgeRequest struct {
	Sequence uint64 `json:"sequence,omitempty"`
	DLQFilter
	All bool `json:"all,omitempty"`
}

// PurgeResponse counts deleted letters.
type PurgeResponse struct {
	Purged int `json:"purged"`
}

// AgentInfo is an agent as the supervisor sees it.
type AgentInfo struct {
	ID        string        `json:"id"`
	State     string        `json:"state"`
	Hostname  string        `json:"hostname,omitempty"`
	PID       int64         `json:"pid,omitempty"`
	Version   string        `json:"version,omitempty"`
	Queues    []string      `json:"queues,omitempty"`
	Kinds     []string      `json:"kinds,omitempty"`
	Capacity  int           `json:"capacity"`
	Jobs      int           `json:"jobs"`
	Interval  time.Duration `json:"interval"`
	StartedAt time.Time     `json:"started_at,omitzero"`
	LastSeen  time.Time     `json:"last_seen"`
	SilentFor time.Duration `json:"silent_for"`
	DeadAt    time.Time     `json:"dead_at,omitzero"`
}

// AgentsResponse lists agents.
type AgentsResponse struct {
	Agents []AgentInfo `json:"agents"`
}

// RunningJob is a job an agent holds, from its latest heartbeat.
type RunningJob struct {
	AgentID        string    `json:"agent_id"`
	JobID          string    `json:"job_id"`
	Queue          string    `json:"queue"`
	Kind           string    `json:"kind"`
	Attempt        uint32    `json:"attempt"`
	Delivered      uint64    `json:"delivered"`
	StreamSequence uint64    `json:"stream_sequence"`
	StartedAt      time.Time `json:"started_at,omitzero"`
	Deadline       time.Time `json:"deadline,omitzero"`
	// State is running, overdue (past its deadline), cancel_sent,
	// timed_out (the supervisor failed the attempt) or ack_overdue
	// (JetStream delivered the job again: no ack or progress within AckWait).
	State string `json:"state"`
}

// JobsRequest filters running jobs.
type JobsRequest struct {
	Queue   string `json:"queue,omitempty"`
	Kind    string `json:"kind,omitempty"`
	AgentID string `json:"agent_id,omitempty"`
}

// JobsResponse lists running jobs.
type JobsResponse struct {
	Jobs []RunningJob `json:"jobs"`
}

// JobRequest names a job; Queue and Kind narrow the lookup when known.
type JobRequest struct {
	JobID string `json:"job_id"`
	Queue string `json:"queue,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// JobResponse is a job's status: its latest event, and where it runs now.
type JobResponse struct {
	JobID string `json:"job_id"`
	// Event is the latest JobEvent document; EventSequence its sequence in EVENTS.
	Event         json.RawMessage `json:"event,omitempty"`
	EventSequence uint64          `json:"event_sequence,omitempty"`
	Running       []RunningJob    `json:"running,omitempty"`
}

// Decode returns the latest event, or nil.
func (r *JobResponse) Decode() (*jetfleetpb.JobEvent, error) {
	if len(r.Event) == 0 {
		return nil, nil
	}
	var ev jetfleetpb.JobEvent
	return &ev, protocol.Unmarshal(r.Event, &ev)
}

// HistoryRequest asks for the last executions of a kind (in Queue, or in
// every queue) or of a schedule.
type HistoryRequest struct {
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
	// Limit defaults to supervisor.history_size.
	Limit int `json:"limit,omitempty"`
}

// HistoryResponse holds Execution documents, newest first, and their statistics.
type HistoryResponse struct {
	Executions []json.RawMessage `json:"executions"`
	Stats      Stats             `json:"stats"`
}

// Decode returns the executions.
func (r *HistoryResponse) Decode() ([]*jetfleetpb.Execution, error) {
	out := make([]*jetfleetpb.Execution, len(r.Executions))
	for i, raw := range r.Executions {
		out[i] = &jetfleetpb.Execution{}
		if err := protocol.Unmarshal(raw, out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// StatusResponse is the fleet at a glance.
type StatusResponse struct {
	// Replica is the holder name of the replica that answered; Leader is
	// the holder of the lease.
	Replica     string        `json:"replica"`
	Leader      string        `json:"leader,omitempty"`
	AgentsAlive int           `json:"agents_alive"`
	AgentsDrain int           `json:"agents_draining"`
	AgentsDead  int           `json:"agents_dead"`
	Capacity    int           `json:"capacity"`
	Running     int           `json:"running"`
	Queues      []QueueStatus `json:"queues"`
	DLQDepth    uint64        `json:"dlq_depth"`
	// Unroutable counts the jobs in JOBS that no queue consumer delivers
	// (a queue without a consumer, a subject of the wrong shape); the
	// leader dead-letters them after supervisor.unroutable_after.
	Unroutable uint64 `json:"unroutable"`
	// Attention lists running jobs past their deadline or whose ack is overdue.
	Attention []RunningJob `json:"attention,omitempty"`
}

// QueueStatus is one queue's consumer.
type QueueStatus struct {
	Queue       string        `json:"queue"`
	Pending     uint64        `json:"pending"`
	AckPending  int           `json:"ack_pending"`
	Redelivered int           `json:"redelivered"`
	Waiting     int           `json:"waiting"`
	AckWait     time.Duration `json:"ack_wait"`
	MaxDeliver  int           `json:"max_deliver"`
	Paused      bool          `json:"paused,omitempty"`
	PausedUntil time.Time     `json:"paused_until,omitzero"`
	// Breaker is open while the circuit breaker holds the queue paused.
	Breaker string `json:"breaker"`
	// Declared is set for a queue declared under topology.queues (the
	// supervisor keeps its consumer at the declared settings).
	Declared bool `json:"declared,omitempty"`
}

func (s *Supervisor) serveAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name: ServiceName, Version: ServiceVersion,
		Description: "jetfleet supervisor: dead letters (ls, get, replay, purge), agents, jobs, history, status, queues (ls, add, rm)",
		Metadata:    map[string]string{"holder": s.holder},
	})
	if err != nil {
		return nil, err
	}
	groups := []struct {
		subject   string
		endpoints map[string]func(context.Context, []byte) (any, error)
	}{
		{DLQAPISubject, map[string]func(context.Context, []byte) (any, error){
			EndpointDLQList: s.apiDLQList, EndpointDLQGet: s.apiDLQGet, EndpointDLQReplay: s.apiDLQReplay, EndpointDLQPurge: s.apiDLQPurge,
		}},
		{APISubject, map[string]func(context.Context, []byte) (any, error){
			EndpointAgents: s.apiAgents, EndpointJobs: s.apiJobs, EndpointJob: s.apiJob, EndpointHistory: s.apiHistory,
			EndpointStatus: s.apiStatus,
		}},
		{QueuesAPISubject, map[string]func(context.Context, []byte) (any, error){
			EndpointQueueList: s.apiQueues, EndpointQueueAdd: s.apiQueueAdd, EndpointQueueRemove: s.apiQueueRemove,
		}},
	}
	for _, grp := range groups {
		g := svc.AddGroup(grp.subject)
		for name, h := range grp.endpoints {
			if err := g.AddEndpoint(name, s.handler(h)); err != nil {
				_ = svc.Stop()
				return nil, err
			}
		}
	}
	return svc, nil
}

func (s *Supervisor) handler(h func(context.Context, []byte) (any, error)) micro.HandlerFunc {
	return func(req micro.Request) {
		ctx, cancel := context.WithTimeout(s.runner.Context(), 6*s.cfg.RequestTimeout)
		defer cancel()
		res, err := h(ctx, req.Data())
		if err != nil {
			protocol.RespondError(req, internal(err))
			return
		}
		data, err := json.Marshal(res)
		if err != nil {
			protocol.RespondError(req, internal(err))
			return
		}
		_ = req.Respond(data)
	}
}

func internal(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return protocol.Errorf(protocol.CodeUnavailable, "%v", err)
	}
	return protocol.Errorf(protocol.CodeInternal, "%v", err)
}

func decodeJSON(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return protocol.Errorf(protocol.CodeInvalidArgument, "request: %v", err)
	}
	return nil
}

func (s *Supervisor) apiDLQList(ctx context.Context, data []byte) (any, error) {
	var req DLQListRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if err := req.validate(); err != nil {
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
		letters = []DeadLetterEntry{}
	}
	return &DLQListResponse{Letters: letters, Next: next}, nil
}

func (s *Supervisor) apiDLQGet(ctx context.Context, data []byte) (any, error) {
	var req SequenceRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if req.Sequence == 0 {
		return nil, protocol.FieldError("sequence", "is required")
	}
	return s.getDLQ(ctx, req.Sequence)
}

func (s *Supervisor) apiDLQReplay(ctx context.Context, data []byte) (any, error) {
	var req ReplayRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if err := req.validate(); err != nil {
		return nil, err
	}
	if req.Sequence > 0 {
		r, err := s.replay(ctx, req.Sequence, req.Force)
		if err != nil {
			return nil, err
		}
		return &ReplayResponse{Results: []ReplayResult{*r}}, nil
	}
	if req.DLQFilter.empty() && !req.All {
		return nil, protocol.FieldError("all", "set a sequence, a filter, or all")
	}
	limit := req.Limit
	if limit <= 0 {
		limit = 1000
	}
	limit = min(limit, 10_000)
	res := &ReplayResponse{Results: []ReplayResult{}}
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
				res.Results = append(res.Results, ReplayResult{DLQSequence: e.Sequence, JobID: e.JobID, Error: err.Error()})
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
	var req PurgeRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if err := req.validate(); err != nil {
		return nil, err
	}
	if req.Sequence == 0 && req.DLQFilter.empty() && !req.All {
		return nil, protocol.FieldError("all", "set a sequence, a filter, or all")
	}
	n, err := s.purgeDLQ(ctx, req.Sequence, req.DLQFilter, req.All)
	if err != nil {
		return nil, err
	}
	return &PurgeResponse{Purged: n}, nil
}

func (s *Supervisor) apiAgents(_ context.Context, data []byte) (any, error) {
	var req struct{}
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	return &AgentsResponse{Agents: s.tracker.snapshot(s.clk.Now())}, nil
}

func (s *Supervisor) apiJobs(_ context.Context, data []byte) (any, error) {
	var req JobsRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	out := []RunningJob{}
	for _, j := range s.tracker.running(s.clk.Now()) {
		if (req.Queue == "" || j.Queue == req.Queue) && (req.Kind == "" || j.Kind == req.Kind) &&
			(req.AgentID == "" || j.AgentID == req.AgentID) {
			out = append(out, j)
		}
	}
	return &JobsResponse{Jobs: out}, nil
}

func (s *Supervisor) apiJob(ctx context.Context, data []byte) (any, error) {
	var req JobRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateJobID(req.JobID); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	if (req.Queue == "") != (req.Kind == "") {
		return nil, protocol.FieldError("kind", "give both queue and kind, or neither")
	}
	res := &JobResponse{JobID: req.JobID}
	ev, seq, err := s.latestEventSeq(ctx, req.Queue, req.Kind, req.JobID)
	if err != nil {
		return nil, internal(err)
	}
	if ev != nil {
		res.Event, _ = protocol.Marshal(ev)
		res.EventSequence = seq
	}
	for _, j := range s.tracker.running(s.clk.Now()) {
		if j.JobID == req.JobID {
			res.Running = append(res.Running, j)
		}
	}
	if ev == nil && len(res.Running) == 0 {
		return nil, &protocol.Error{Code: protocol.CodeNotFound, Field: "job_id", Message: fmt.Sprintf("no event of job %q", req.JobID)}
	}
	return res, nil
}

func (s *Supervisor) apiHistory(ctx context.Context, data []byte) (any, error) {
	var req HistoryRequest
	if err := decodeJSON(data, &req); err != nil {
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
	res := &HistoryResponse{Executions: make([]json.RawMessage, 0, len(recs)), Stats: statsOf(recs)}
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
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	now := s.clk.Now()
	res := &StatusResponse{Replica: s.holder, Queues: []QueueStatus{}}
	if lv, err := lease.Read(ctx, s.leases, s.cfg.LeaseKey); err == nil {
		res.Leader = lv.Holder
	}
	for _, a := range s.tracker.snapshot(now) {
		switch a.State {
		case AgentDead:
			res.AgentsDead++
			continue
		case AgentDraining:
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

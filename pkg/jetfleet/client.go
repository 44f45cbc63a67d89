package jetfleet

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Client enqueues jobs, reads their status, and calls the scheduler's and
// the supervisor's APIs — everything a program does with a fleet from the
// outside, on one NATS connection. It is safe for concurrent use. Errors
// the services return are *protocol.Error values: match them with errors.Is
// against protocol.Code(protocol.CodeNotFound) and friends.
type Client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	tracer trace.Tracer
	mu     sync.Mutex
	// events and delayed are the EVENTS and DELAYED streams, looked up on
	// first use.
	events, delayed jetstream.Stream
	// unique is bucket unique, looked up on first use (unique.go).
	unique jetstream.KeyValue
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithTracerProvider makes the client's producer spans (jetfleet.enqueue
// <kind>) with tp instead of OpenTelemetry's global provider.
func WithTracerProvider(tp trace.TracerProvider) ClientOption {
	return func(c *Client) { c.tracer = tp.Tracer(tracerName) }
}

const tracerName = "github.com/jetfleet/jetfleet/pkg/jetfleet"

// NewClient returns a client on nc, which the caller keeps owning (and
// closes). Every call is bounded by its context.
func NewClient(nc *nats.Conn, opts ...ClientOption) *Client {
	js, _ := jetstream.New(nc) // fails only on options, and none are given
	c := &Client{nc: nc, js: js, tracer: otel.GetTracerProvider().Tracer(tracerName)}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Conn is the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

func (c *Client) call(ctx context.Context, service, subject string, req, res any) error {
	return protocol.CallAPI(ctx, c.nc, service, subject, req, res)
}

func (c *Client) scheduler(ctx context.Context, subject string, req, res any) error {
	return c.call(ctx, "scheduler", subject, req, res)
}

func (c *Client) supervisor(ctx context.Context, subject string, req, res any) error {
	return c.call(ctx, "supervisor", subject, req, res)
}

// AddSchedule stores a new schedule.
func (c *Client) AddSchedule(ctx context.Context, s *Schedule) (*ScheduleInfo, error) {
	var info ScheduleInfo
	return &info, c.scheduler(ctx, protocol.APIScheduleAdd, s, &info)
}

// UpdateSchedule replaces a schedule's description, spec, target and
// policy; a non-zero revision must match the stored one.
func (c *Client) UpdateSchedule(ctx context.Context, s *Schedule, revision uint64) (*ScheduleInfo, error) {
	var info ScheduleInfo
	return &info, c.scheduler(ctx, protocol.APIScheduleUpdate, &ScheduleUpdateRequest{Schedule: *s, Revision: revision}, &info)
}

// GetSchedule returns a schedule with its state and next fire times.
func (c *Client) GetSchedule(ctx context.Context, id string) (*ScheduleInfo, error) {
	var info ScheduleInfo
	return &info, c.scheduler(ctx, protocol.APIScheduleGet, &ScheduleIDRequest{ID: id}, &info)
}

// ListSchedules returns one page of schedules.
func (c *Client) ListSchedules(ctx context.Context, req ScheduleListRequest) (*ScheduleListResponse, error) {
	var res ScheduleListResponse
	return &res, c.scheduler(ctx, protocol.APIScheduleList, &req, &res)
}

// RemoveSchedule deletes a schedule and its state.
func (c *Client) RemoveSchedule(ctx context.Context, id string) error {
	return c.scheduler(ctx, protocol.APIScheduleRemove, &ScheduleIDRequest{ID: id}, nil)
}

// PauseSchedule stops a schedule from firing; note says why.
func (c *Client) PauseSchedule(ctx context.Context, id, note string) (*ScheduleInfo, error) {
	var info ScheduleInfo
	return &info, c.scheduler(ctx, protocol.APISchedulePause, &SchedulePauseRequest{ID: id, Note: note}, &info)
}

// ResumeSchedule lets a paused schedule fire again, from now on.
func (c *Client) ResumeSchedule(ctx context.Context, id string) (*ScheduleInfo, error) {
	var info ScheduleInfo
	return &info, c.scheduler(ctx, protocol.APIScheduleResume, &ScheduleIDRequest{ID: id}, &info)
}

// TriggerSchedule fires a schedule now, respecting its overlap policy.
func (c *Client) TriggerSchedule(ctx context.Context, id string) (*TriggerResponse, error) {
	var res TriggerResponse
	return &res, c.scheduler(ctx, protocol.APIScheduleTrigger, &ScheduleIDRequest{ID: id}, &res)
}

// PreviewSchedule returns the next nominal times of a stored schedule
// (req.ID) or of a definition (req.Schedule).
func (c *Client) PreviewSchedule(ctx context.Context, req PreviewRequest) (*PreviewResponse, error) {
	var res PreviewResponse
	return &res, c.scheduler(ctx, protocol.APISchedulePreview, &req, &res)
}

// BackfillSchedule fires every nominal time of a schedule in [from, to].
func (c *Client) BackfillSchedule(ctx context.Context, id string, from, to time.Time, maxFires int) (*BackfillResponse, error) {
	var res BackfillResponse
	return &res, c.scheduler(ctx, protocol.APIScheduleBackfill, &BackfillRequest{ID: id, From: from, To: to, Max: maxFires}, &res)
}

// ListDeadLetters returns one page of dead letters.
func (c *Client) ListDeadLetters(ctx context.Context, req DLQListRequest) (*DLQListResponse, error) {
	var res DLQListResponse
	return &res, c.supervisor(ctx, protocol.APIDLQList, &req, &res)
}

// DeadLetter returns one dead letter with its document.
func (c *Client) DeadLetter(ctx context.Context, seq uint64) (*DeadLetterEntry, error) {
	var res DeadLetterEntry
	return &res, c.supervisor(ctx, protocol.APIDLQGet, &DeadLetterRequest{Sequence: seq}, &res)
}

// ReplayDeadLetters republishes dead letters as new jobs.
func (c *Client) ReplayDeadLetters(ctx context.Context, req ReplayRequest) (*ReplayResponse, error) {
	var res ReplayResponse
	return &res, c.supervisor(ctx, protocol.APIDLQReplay, &req, &res)
}

// PurgeDeadLetters deletes dead letters.
func (c *Client) PurgeDeadLetters(ctx context.Context, req PurgeRequest) (*PurgeResponse, error) {
	var res PurgeResponse
	return &res, c.supervisor(ctx, protocol.APIDLQPurge, &req, &res)
}

// Agents lists the agents the supervisor tracks.
func (c *Client) Agents(ctx context.Context) (*AgentsResponse, error) {
	var res AgentsResponse
	return &res, c.supervisor(ctx, protocol.APIAgents, struct{}{}, &res)
}

// RunningJobs lists the jobs agents hold right now.
func (c *Client) RunningJobs(ctx context.Context, req RunningJobsRequest) (*RunningJobsResponse, error) {
	var res RunningJobsResponse
	return &res, c.supervisor(ctx, protocol.APIRunningJobs, &req, &res)
}

// JobDetail returns, from the supervisor, a job's latest event and the
// agents running it now.
func (c *Client) JobDetail(ctx context.Context, req JobDetailRequest) (*JobDetail, error) {
	var res JobDetail
	return &res, c.supervisor(ctx, protocol.APIJobDetail, &req, &res)
}

// History returns the last executions of a kind or schedule and their statistics.
func (c *Client) History(ctx context.Context, req HistoryRequest) (*HistoryResponse, error) {
	var res HistoryResponse
	return &res, c.supervisor(ctx, protocol.APIHistory, &req, &res)
}

// Status returns the fleet at a glance.
func (c *Client) Status(ctx context.Context) (*FleetStatus, error) {
	var res FleetStatus
	return &res, c.supervisor(ctx, protocol.APIStatus, struct{}{}, &res)
}

// Queues lists the queues and the jobs no queue serves.
func (c *Client) Queues(ctx context.Context) (*QueuesResponse, error) {
	var res QueuesResponse
	return &res, c.supervisor(ctx, protocol.APIQueueList, struct{}{}, &res)
}

// AddQueue creates a queue (its consumer), or changes its settings.
func (c *Client) AddQueue(ctx context.Context, req QueueAddRequest) (*QueueAddResponse, error) {
	var res QueueAddResponse
	return &res, c.supervisor(ctx, protocol.APIQueueAdd, &req, &res)
}

// RemoveQueue deletes a queue (its consumer).
func (c *Client) RemoveQueue(ctx context.Context, req QueueRemoveRequest) (*QueueRemoveResponse, error) {
	var res QueueRemoveResponse
	return &res, c.supervisor(ctx, protocol.APIQueueRemove, &req, &res)
}

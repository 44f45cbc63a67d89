package supervisor

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Client calls the supervisor API. Errors the supervisor returns are
// *protocol.Error values: match them with errors.Is against
// protocol.Code(protocol.CodeNotFound) and friends.
type Client struct {
	nc *nats.Conn
}

// NewClient returns a client on nc. Each call is bounded by its context.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

func (c *Client) call(ctx context.Context, subject string, req, res any) error {
	return protocol.CallAPI(ctx, c.nc, "supervisor", subject, req, res)
}

func dlqSubject(endpoint string) string        { return DLQAPISubject + "." + endpoint }
func supervisorSubject(endpoint string) string { return APISubject + "." + endpoint }

// ListDeadLetters returns one page of dead letters.
func (c *Client) ListDeadLetters(ctx context.Context, req DLQListRequest) (*DLQListResponse, error) {
	var res DLQListResponse
	return &res, c.call(ctx, dlqSubject(EndpointDLQList), &req, &res)
}

// DeadLetter returns one dead letter with its document.
func (c *Client) DeadLetter(ctx context.Context, seq uint64) (*DeadLetterEntry, error) {
	var res DeadLetterEntry
	return &res, c.call(ctx, dlqSubject(EndpointDLQGet), &SequenceRequest{Sequence: seq}, &res)
}

// Replay republishes dead letters as new jobs.
func (c *Client) Replay(ctx context.Context, req ReplayRequest) (*ReplayResponse, error) {
	var res ReplayResponse
	return &res, c.call(ctx, dlqSubject(EndpointDLQReplay), &req, &res)
}

// Purge deletes dead letters.
func (c *Client) Purge(ctx context.Context, req PurgeRequest) (*PurgeResponse, error) {
	var res PurgeResponse
	return &res, c.call(ctx, dlqSubject(EndpointDLQPurge), &req, &res)
}

// Agents lists the agents the supervisor tracks.
func (c *Client) Agents(ctx context.Context) (*AgentsResponse, error) {
	var res AgentsResponse
	return &res, c.call(ctx, supervisorSubject(EndpointAgents), struct{}{}, &res)
}

// Jobs lists the jobs agents hold right now.
func (c *Client) Jobs(ctx context.Context, req JobsRequest) (*JobsResponse, error) {
	var res JobsResponse
	return &res, c.call(ctx, supervisorSubject(EndpointJobs), &req, &res)
}

// Job returns a job's latest event and where it runs.
func (c *Client) Job(ctx context.Context, req JobRequest) (*JobResponse, error) {
	var res JobResponse
	return &res, c.call(ctx, supervisorSubject(EndpointJob), &req, &res)
}

// History returns the last executions of a kind or schedule and their statistics.
func (c *Client) History(ctx context.Context, req HistoryRequest) (*HistoryResponse, error) {
	var res HistoryResponse
	return &res, c.call(ctx, supervisorSubject(EndpointHistory), &req, &res)
}

// Status returns the fleet at a glance.
func (c *Client) Status(ctx context.Context) (*StatusResponse, error) {
	var res StatusResponse
	return &res, c.call(ctx, supervisorSubject(EndpointStatus), struct{}{}, &res)
}

func queuesSubject(endpoint string) string { return QueuesAPISubject + "." + endpoint }

// Queues lists the queues and the jobs no queue serves.
func (c *Client) Queues(ctx context.Context) (*QueuesResponse, error) {
	var res QueuesResponse
	return &res, c.call(ctx, queuesSubject(EndpointQueueList), struct{}{}, &res)
}

// AddQueue creates a queue (its consumer), or changes its settings.
func (c *Client) AddQueue(ctx context.Context, req QueueAddRequest) (*QueueAddResponse, error) {
	var res QueueAddResponse
	return &res, c.call(ctx, queuesSubject(EndpointQueueAdd), &req, &res)
}

// RemoveQueue deletes a queue (its consumer).
func (c *Client) RemoveQueue(ctx context.Context, req QueueRemoveRequest) (*QueueRemoveResponse, error) {
	var res QueueRemoveResponse
	return &res, c.call(ctx, queuesSubject(EndpointQueueRemove), &req, &res)
}

package scheduler

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Client calls the scheduler API. Errors the scheduler returns are
// *protocol.Error values: match them with errors.Is against
// protocol.Code(protocol.CodeNotFound) and friends, and read Field with
// errors.As.
type Client struct {
	nc *nats.Conn
}

// NewClient returns a client on nc. Each call is bounded by its context.
func NewClient(nc *nats.Conn) *Client { return &Client{nc: nc} }

func (c *Client) call(ctx context.Context, endpoint string, req, res any) error {
	return protocol.CallAPI(ctx, c.nc, "scheduler", APISubject+"."+endpoint, req, res)
}

// Add stores a new schedule.
func (c *Client) Add(ctx context.Context, s *Schedule) (*Info, error) {
	var info Info
	return &info, c.call(ctx, EndpointAdd, s, &info)
}

// Update replaces a schedule's description, spec, target and policy; a
// non-zero revision must match the stored one.
func (c *Client) Update(ctx context.Context, s *Schedule, revision uint64) (*Info, error) {
	var info Info
	return &info, c.call(ctx, EndpointUpdate, &UpdateRequest{Schedule: *s, Revision: revision}, &info)
}

// Get returns a schedule with its state and next fire times.
func (c *Client) Get(ctx context.Context, id string) (*Info, error) {
	var info Info
	return &info, c.call(ctx, EndpointGet, &IDRequest{ID: id}, &info)
}

// List returns one page of schedules.
func (c *Client) List(ctx context.Context, req ListRequest) (*ListResponse, error) {
	var res ListResponse
	return &res, c.call(ctx, EndpointList, &req, &res)
}

// Remove deletes a schedule and its state.
func (c *Client) Remove(ctx context.Context, id string) error {
	return c.call(ctx, EndpointRemove, &IDRequest{ID: id}, nil)
}

// Pause stops a schedule from firing; note says why.
func (c *Client) Pause(ctx context.Context, id, note string) (*Info, error) {
	var info Info
	return &info, c.call(ctx, EndpointPause, &PauseRequest{ID: id, Note: note}, &info)
}

// Resume lets a paused schedule fire again, from now on.
func (c *Client) Resume(ctx context.Context, id string) (*Info, error) {
	var info Info
	return &info, c.call(ctx, EndpointResume, &IDRequest{ID: id}, &info)
}

// Trigger fires a schedule now, respecting its overlap policy.
func (c *Client) Trigger(ctx context.Context, id string) (*TriggerResponse, error) {
	var res TriggerResponse
	return &res, c.call(ctx, EndpointTrigger, &IDRequest{ID: id}, &res)
}

// Preview returns the next nominal times of a stored schedule (req.ID) or
// of a definition (req.Schedule).
func (c *Client) Preview(ctx context.Context, req PreviewRequest) (*PreviewResponse, error) {
	var res PreviewResponse
	return &res, c.call(ctx, EndpointPreview, &req, &res)
}

// Backfill fires every nominal time of a schedule in [from, to].
func (c *Client) Backfill(ctx context.Context, id string, from, to time.Time, maxFires int) (*BackfillResponse, error) {
	var res BackfillResponse
	return &res, c.call(ctx, EndpointBackfill, &BackfillRequest{ID: id, From: from, To: to, Max: maxFires}, &res)
}

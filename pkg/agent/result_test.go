package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestRecordResult: a handler's result travels with its succeeded event; a
// result above max_result is refused, and a failed attempt keeps none.
func TestRecordResult(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	refused := make(chan error, 1)
	f.startAgent(t, agent.Config{MaxResult: 1024, Retry: agent.RetryConfig{MaxAttempts: 1}}, func(a *agent.Agent) {
		must(t, a.Register("count", func(ctx context.Context, job *agent.Job) error {
			refused <- agent.RecordResult(ctx, strings.Repeat("x", 2000))
			if string(job.Payload) == "fail" {
				must(t, agent.RecordResult(ctx, map[string]int{"rows": 1}))
				return agent.NonRetryable(errors.New("upstream gone"))
			}
			return agent.RecordResult(ctx, map[string]int{"rows": 42})
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "count-1", Queue: "default", Kind: "count"})
	ev := f.events.WaitFor(t, 10*time.Second, "count-1", protocol.EventSucceeded)
	assert.Equal(t, `{"rows":42}`, string(ev.GetResult()))
	assert.ErrorIs(t, <-refused, agent.ErrResultTooLarge)
	fleettest.Publish(t, f.js, protocol.Job{ID: "count-2", Queue: "default", Kind: "count", Payload: []byte("fail")})
	assert.ErrorIs(t, <-refused, agent.ErrResultTooLarge)
	dead := f.events.WaitFor(t, 10*time.Second, "count-2", protocol.EventDead)
	assert.Empty(t, dead.GetResult(), "only a succeeded event carries the result")
	assert.ErrorIs(t, agent.RecordResult(context.Background(), json.RawMessage(`{"a":`)), agent.ErrInvalidResult)
}

// TestAResultOverTheLimitFailsTheAttempt: a handler that ignores the
// refusal of its result and returns nil does not succeed — a workflow's
// next step would read a success without the result it needs. The attempt
// fails once, non-retryable, naming the limit.
func TestAResultOverTheLimitFailsTheAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var runs atomic.Int32
	f.startAgent(t, agent.Config{MaxResult: 1024}, func(a *agent.Agent) {
		must(t, a.Register("listing", func(ctx context.Context, job *agent.Job) error {
			runs.Add(1)
			_ = agent.RecordResult(ctx, strings.Repeat("x", 2000)) // ignored: the point of the test
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "listing-1", Queue: "default", Kind: "listing"})
	dead := f.events.WaitFor(t, 10*time.Second, "listing-1", protocol.EventDead)
	assert.Equal(t, protocol.CodeNonRetryable, dead.GetErrorCode())
	assert.Contains(t, dead.GetError(), "result was refused")
	assert.Contains(t, dead.GetError(), "2002 bytes of JSON, agent.max_result is 1KiB")
	assert.Empty(t, dead.GetResult())
	assert.Equal(t, []string{protocol.EventFailed, protocol.EventDead}, f.events.Of("listing-1"), "not retried: the same result would come again")
	assert.Equal(t, int32(1), runs.Load())
}

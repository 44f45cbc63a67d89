package agent

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestDeliveryWithoutSlotIsHandedBack: a pull request the agent no longer
// counts (one it gave up on as lost, answered after all — as after a
// reconnect) delivers a job while every slot is busy. The agent never runs
// more jobs than its concurrency: it hands the job back at once, without
// spending an attempt, and counts it.
func TestDeliveryWithoutSlotIsHandedBack(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	nc, js := natstest.JetStream(t, srv)
	events := fleettest.WatchJobEvents(t, nc)
	a, err := New(env.Env.Conn, Config{ID: "one-slot", Concurrency: 1}, WithEnv(env.Env))
	require.NoError(t, err)
	release := make(chan struct{})
	var running, peak atomic.Int32
	require.NoError(t, a.Register("hold", func(ctx context.Context, job *Job) error {
		n := running.Add(1)
		defer running.Add(-1)
		if n > peak.Load() {
			peak.Store(n)
		}
		<-release
		return nil
	}, KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(ctx))
	})

	fleettest.Publish(t, js, protocol.Job{ID: "first", Queue: "default", Kind: "hold"})
	require.Eventually(t, func() bool { return running.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	fleettest.Publish(t, js, protocol.Job{ID: "second", Queue: "default", Kind: "hold"})
	p := a.defaultPuller(t)
	require.NoError(t, nc.PublishRequest(p.subject, p.inbox+".424242", []byte(`{"batch":1,"expires":1000000000}`)))

	handedBack := events.WaitFor(t, 10*time.Second, "second", protocol.EventReleased)
	assert.True(t, strings.HasPrefix(handedBack.GetReason(), "no free slot"), handedBack.GetReason())
	assert.Equal(t, uint32(1), handedBack.GetSnoozes(), "no attempt spent")
	assert.Equal(t, int32(1), peak.Load(), "ran beyond its concurrency")
	close(release)
	second := events.WaitFor(t, 10*time.Second, "second", protocol.EventSucceeded)
	assert.Equal(t, uint32(1), second.GetAttempt())
	events.WaitFor(t, 10*time.Second, "first", protocol.EventSucceeded)
	assert.Equal(t, int32(1), peak.Load())
}

// TestHandBackWithoutSlotCountsEarlierSnoozes: a job handed back for want
// of a slot twice reads what its first hand-back stored before it hands it
// back again, so its snooze count goes up each time (no attempt spent).
func TestHandBackWithoutSlotCountsEarlierSnoozes(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	nc, js := natstest.JetStream(t, srv)
	events := fleettest.WatchJobEvents(t, nc)
	a, err := New(env.Conn, Config{ID: "busy", Concurrency: 1}, WithEnv(env.Env))
	require.NoError(t, err)
	release := make(chan struct{})
	var running atomic.Int32
	require.NoError(t, a.Register("hold", func(ctx context.Context, job *Job) error {
		running.Add(1)
		<-release
		return nil
	}, KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		close(release)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(ctx))
	})
	fleettest.Publish(t, js, protocol.Job{ID: "occupant", Queue: "default", Kind: "hold"})
	require.Eventually(t, func() bool { return running.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	fleettest.Publish(t, js, protocol.Job{ID: "bounced", Queue: "default", Kind: "hold"})
	p := a.defaultPuller(t)
	for i, want := range []uint32{1, 2} {
		require.NoError(t, nc.PublishRequest(p.subject, fmt.Sprintf("%s.%d", p.inbox, 900000+i), []byte(`{"batch":1,"expires":1000000000}`)))
		ev := events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
			return ev.GetJobId() == "bounced" && ev.GetType() == protocol.EventReleased && ev.GetDelivered() == uint64(i+1)
		})
		assert.Equal(t, want, ev.GetSnoozes(), "hand-back %d", i+1)
	}
}

// defaultPuller is the puller of the agent's first queue at default priority.
func (a *Agent) defaultPuller(t *testing.T) *puller {
	t.Helper()
	for _, p := range a.pullers {
		if p.priority == protocol.PriorityDefault {
			return p
		}
	}
	t.Fatal("no default-priority puller")
	return nil
}

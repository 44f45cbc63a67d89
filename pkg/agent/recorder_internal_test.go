package agent

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestRecorderDoesNotResendSupersededEvents publishes two events of a job
// while the EVENTS stream is missing, then brings the stream back: only the
// newer event may be stored, because a late resend of the older one would
// become the job's latest event and misstate its status.
func TestRecorderDoesNotResendSupersededEvents(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	r := startRecorder(t, nc, js)

	ev := func(typ string) *jetfleetpb.JobEvent {
		return &jetfleetpb.JobEvent{Type: typ, JobId: "j-1", Queue: "default", Kind: "echo", StreamSequence: 7}
	}
	r.event(ev(protocol.EventFailed))
	r.event(ev(protocol.EventDead))
	// Once the server answered both publishes (no stream: no responders),
	// the stream comes back; the resend waits at least 100ms.
	require.NoError(t, nc.Flush())
	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 10*time.Second), js, topology.Config{}))
	require.NoError(t, r.flush(fleettest.Ctx(t, 20*time.Second)))

	s, err := js.Stream(fleettest.Ctx(t, 5*time.Second), protocol.StreamEvents)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(fleettest.Ctx(t, 5*time.Second), protocol.JobEventsOfID("j-1"))
	require.NoError(t, err, "the newer event was resent once the stream was back")
	var latest jetfleetpb.JobEvent
	require.NoError(t, protocol.Unmarshal(m.Data, &latest))
	assert.Equal(t, protocol.EventDead, latest.GetType())
	info, err := s.Info(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs, "the superseded failed event was not sent again")
}

// TestRecorderDoesNotResendAnEventOlderThanAConfirmedOne covers a job whose
// newer event was confirmed (and so forgotten) while an older one still
// waited to be sent again: the older one must stay superseded.
func TestRecorderDoesNotResendAnEventOlderThanAConfirmedOne(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	r := startRecorder(t, nc, js)

	ev := func(typ string) *jetfleetpb.JobEvent {
		return &jetfleetpb.JobEvent{Type: typ, JobId: "j-2", Queue: "default", Kind: "echo", StreamSequence: 9}
	}
	r.event(ev(protocol.EventStarted)) // fails: no stream yet
	require.NoError(t, nc.Flush())
	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 10*time.Second), js, topology.Config{}))
	require.NoError(t, r.eventNow(fleettest.Ctx(t, 5*time.Second), ev(protocol.EventReleased)))
	require.NoError(t, r.flush(fleettest.Ctx(t, 20*time.Second)))

	s, err := js.Stream(fleettest.Ctx(t, 5*time.Second), protocol.StreamEvents)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(fleettest.Ctx(t, 5*time.Second), protocol.JobEventsOfID("j-2"))
	require.NoError(t, err)
	var latest jetfleetpb.JobEvent
	require.NoError(t, protocol.Unmarshal(m.Data, &latest))
	assert.Equal(t, protocol.EventReleased, latest.GetType(), "the older started event was not sent after it")
}

// startRecorder starts a recorder on nc as an agent does; it is closed when
// the test ends.
func startRecorder(t *testing.T, nc *nats.Conn, js jetstream.JetStream) *recorder {
	t.Helper()
	rep, err := newReplies(nc, asyncTimeout)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go rep.expireLoop(ctx)
	gate := newConnGate(nc)
	go gate.run(ctx)
	r := newRecorder(js, rep, gate, fleettest.Logger(t))
	t.Cleanup(func() {
		r.close(fleettest.Ctx(t, 10*time.Second))
		cancel()
		rep.close()
	})
	return r
}

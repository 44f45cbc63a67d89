package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestHistoryStatusAndJobViews: finished runs become execution records
// with statistics per kind; a job's status is its latest event plus where
// it runs; the status shows agents, queues and dead letters.
func TestHistoryStatusAndJobViews(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{HistorySize: 5}), nil)
	release := make(chan struct{})
	defer close(release)
	f.startAgent(t, "", agent.Config{ID: "a-1", Concurrency: 4}, func(a *agent.Agent) {
		must(t, a.Register("resize", func(_ context.Context, job *agent.Job) error {
			if string(job.Payload) == "bad" {
				return agent.NonRetryable(errors.New("corrupt image"))
			}
			time.Sleep(time.Duration(len(job.Payload)) * time.Millisecond) // the work: 1ms per payload byte
			return nil
		}, agent.KindOptions{}))
		must(t, a.Register("hold", func(ctx context.Context, _ *agent.Job) error {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}, agent.KindOptions{}))
	})
	for i := range 7 { // one after the other: the history's order is known
		payload := make([]byte, 10*(i+1))
		typ := protocol.EventSucceeded
		if i == 6 {
			payload, typ = []byte("bad"), protocol.EventDead
		}
		id := fmt.Sprintf("img-%d", i)
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "resize", Payload: payload})
		f.events.WaitFor(t, 10*time.Second, id, typ)
	}
	ctx := fleettest.Ctx(t, 30*time.Second)
	var hist *jetfleet.HistoryResponse
	waitFor(t, 10*time.Second, "the history of the last 5 runs", func() bool {
		var err error
		hist, err = f.client.History(ctx, jetfleet.HistoryRequest{Kind: "resize"})
		return err == nil && hist.Stats.Executions == 5 && hist.Stats.Dead == 1
	})
	st := hist.Stats
	assert.Equal(t, 4, st.Succeeded)
	assert.InDelta(t, 0.8, st.SuccessRate, 0.001)
	assert.Equal(t, 1, st.ConsecutiveFailures)
	assert.GreaterOrEqual(t, st.P95, 50*time.Millisecond, "p95 of 0, 30, 40, 50 and 60ms")
	assert.GreaterOrEqual(t, st.P50, 30*time.Millisecond)
	assert.LessOrEqual(t, st.P50, st.P95)
	recs, err := hist.Decode()
	require.NoError(t, err)
	require.Len(t, recs, 5)
	assert.Equal(t, "img-6", recs[0].GetJobId(), "newest first")
	assert.Equal(t, protocol.EventDead, recs[0].GetStatus())
	assert.Equal(t, protocol.ReasonNonRetryable, recs[0].GetReason())
	assert.Equal(t, "corrupt image", recs[0].GetError())
	assert.Equal(t, uint32(1), recs[0].GetConsecutiveFailures())
	assert.Equal(t, "img-2", recs[4].GetJobId(), "the oldest records went")
	assert.Equal(t, protocol.EventSucceeded, recs[1].GetStatus())
	assert.Equal(t, "a-1", recs[1].GetAgentId())
	assert.Equal(t, uint32(1), recs[1].GetAttempts())
	assert.NotEmpty(t, recs[1].GetTraceId())
	assert.GreaterOrEqual(t, recs[1].GetDuration().AsDuration(), 60*time.Millisecond)
	inQueue, err := f.client.History(ctx, jetfleet.HistoryRequest{Kind: "resize", Queue: "default", Limit: 2})
	require.NoError(t, err)
	assert.Len(t, inQueue.Executions, 2)
	_, err = f.client.History(ctx, jetfleet.HistoryRequest{})
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)), "%v", err)

	job, err := f.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: "img-0"})
	require.NoError(t, err)
	ev, err := job.Decode()
	require.NoError(t, err)
	assert.Equal(t, protocol.EventSucceeded, ev.GetType())
	assert.Empty(t, job.Running)
	_, err = f.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: "nope"})
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeNotFound)), "%v", err)

	fleettest.Publish(t, f.js, protocol.Job{ID: "held-1", Queue: "default", Kind: "hold", Timeout: time.Hour})
	var running *jetfleet.JobDetail
	waitFor(t, 10*time.Second, "a heartbeat listing held-1", func() bool {
		running, err = f.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: "held-1", Queue: "default", Kind: "hold"})
		return err == nil && len(running.Running) == 1
	})
	assert.Equal(t, "a-1", running.Running[0].AgentID)
	assert.Equal(t, "running", running.Running[0].State)
	assert.WithinDuration(t, time.Now().Add(time.Hour), running.Running[0].Deadline, time.Minute)
	jobs, err := f.client.RunningJobs(ctx, jetfleet.RunningJobsRequest{Kind: "hold"})
	require.NoError(t, err)
	require.Len(t, jobs.Jobs, 1)

	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, status.AgentsAlive)
	assert.Equal(t, 1, status.Running)
	assert.Equal(t, 4, status.Capacity)
	assert.Equal(t, uint64(1), status.DLQDepth)
	require.Len(t, status.Queues, 1)
	assert.Equal(t, "default", status.Queues[0].Queue)
	assert.Equal(t, 1, status.Queues[0].AckPending)
	assert.Equal(t, "closed", status.Queues[0].Breaker)
	agents, err := f.client.Agents(ctx)
	require.NoError(t, err)
	require.Len(t, agents.Agents, 1)
	assert.Equal(t, jetfleet.AgentAlive, agents.Agents[0].State)
	assert.Equal(t, []string{"hold", "resize"}, agents.Agents[0].Kinds)
}

// TestShippedConfigLoads checks config/supervisor.yaml against the defaults.
func TestShippedConfigLoads(t *testing.T) {
	t.Parallel()
	cfg := supervisor.DefaultServiceConfig()
	_, err := config.Load(cfg, config.Options{Files: []string{"../../config/fleet.yaml", "../../config/supervisor.yaml"}, Environ: []string{}})
	require.NoError(t, err)
	assert.Equal(t, "supervisor", cfg.Supervisor.LeaseKey)
	assert.Equal(t, 3, cfg.Supervisor.MissedHeartbeats)
	assert.Equal(t, 250*time.Millisecond, cfg.Supervisor.CheckInterval)
	assert.Equal(t, "critical", cfg.Supervisor.Escalation.Default.Alert)
	assert.Equal(t, supervisor.DefaultHTTPAddr, cfg.Telemetry.HTTPAddr)
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	cfg := supervisor.DefaultServiceConfig()
	_, err := config.Load(cfg, config.Options{Environ: []string{}, Sets: []string{
		"supervisor.missed_heartbeats=1", "supervisor.breaker.default.failure_rate=2", "supervisor.alerts.webhooks.ops.url=ftp://x",
		"supervisor.escalation.kinds.mail.timeout_action=explode", "supervisor.renew_interval=4s",
	}})
	require.Error(t, err)
	for _, key := range []string{"supervisor.missed_heartbeats", "supervisor.breaker.default.failure_rate",
		"supervisor.alerts.webhooks.ops.url", "supervisor.escalation.kinds.mail.timeout_action", "supervisor.renew_interval"} {
		assert.ErrorContains(t, err, "config key "+key)
	}
}

// publishDeadEvents stores the dead events of jobs prefix-from … prefix-to
// of kind flaky, as agents would.
func publishDeadEvents(t *testing.T, js jetstream.JetStream, from, to int) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := from; i <= to; i++ {
		ev := &jetfleetpb.JobEvent{Type: protocol.EventDead, JobId: fmt.Sprintf("h-%02d", i), Queue: "default", Kind: "flaky",
			Attempt: 1, MaxAttempts: 1, Reason: protocol.ReasonNonRetryable, Error: "boom", Time: timestamppb.Now()}
		data, err := protocol.Marshal(ev)
		require.NoError(t, err)
		ack, err := js.Publish(fleettest.Ctx(t, 10*time.Second), protocol.JobEventSubject("default", "flaky", protocol.EventDead, ev.GetJobId()), data)
		require.NoError(t, err)
		seqs = append(seqs, ack.Sequence)
	}
	return seqs
}

// waitHistoryInOrder waits for the records of h-01 … h-<n>, and checks each
// counts the dead runs before it: the events were recorded in order.
func waitHistoryInOrder(t *testing.T, f *fixture, n int) {
	t.Helper()
	ctx := fleettest.Ctx(t, 30*time.Second)
	var hist *jetfleet.HistoryResponse
	waitFor(t, 15*time.Second, fmt.Sprintf("%d execution records", n), func() bool {
		var err error
		hist, err = f.client.History(ctx, jetfleet.HistoryRequest{Kind: "flaky"})
		return err == nil && hist.Stats.Executions >= n
	})
	recs, err := hist.Decode()
	require.NoError(t, err)
	require.Len(t, recs, n, "every event recorded once")
	for i, r := range recs { // newest first
		assert.Equal(t, fmt.Sprintf("h-%02d", n-i), r.GetJobId())
		assert.Equal(t, uint32(n-i), r.GetConsecutiveFailures(), r.GetJobId())
	}
	assert.Equal(t, n, hist.Stats.ConsecutiveFailures)
}

// TestHistorySurvivesFailedBatch: the history records of a batch of events
// cannot be stored for a while. The batch is not acked — not even along
// with later events — and is read again, in order, before them: every
// record is written once, each with the right streak of failures.
func TestHistorySurvivesFailedBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	store, err := f.js.Stream(ctx, protocol.StreamSupervisor)
	require.NoError(t, err)
	info, err := store.Info(ctx)
	require.NoError(t, err)
	off := info.Config
	off.Subjects = []string{"jetfleet.supervisor-unavailable.>"} // history records find no stream
	_, err = f.js.UpdateStream(ctx, off)
	require.NoError(t, err)

	publishDeadEvents(t, f.js, 1, 5)
	f.logs.Wait(t, 10*time.Second, "of a failed batch", fleettest.MatchLog("events not handled; they are read again, in order"))
	_, err = f.js.UpdateStream(ctx, info.Config)
	require.NoError(t, err)
	publishDeadEvents(t, f.js, 6, 10)
	waitHistoryInOrder(t, f, 10)
}

// TestHistoryAfterLeaderCrashMidBatch: a leader read a batch of events and
// died before acking them (the test plays it). The next leader reads that
// batch first, not after AckWait behind newer events: every record is
// written, in order.
func TestHistoryAfterLeaderCrashMidBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	_, stop := f.leader(t, fast(supervisor.Config{}), nil)
	stop() // the consumers exist; nobody leads
	ctx := fleettest.Ctx(t, 30*time.Second)
	publishDeadEvents(t, f.js, 1, 5)
	cons, err := f.js.Consumer(ctx, protocol.StreamEvents, "supervisor")
	require.NoError(t, err)
	batch, err := cons.Fetch(5, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	n := 0
	for range batch.Messages() {
		n++
	}
	require.Equal(t, 5, n, "the crashed leader's batch")
	publishDeadEvents(t, f.js, 6, 10)

	f.leader(t, fast(supervisor.Config{}), nil)
	waitHistoryInOrder(t, f, 10)
}

// TestHistoryFillsGapOfPartlyStoredBatch: records are published without
// waiting for each ack, so a batch that failed may have stored its later
// records and not its earlier ones (here written by the test). When the
// events are read again, the missing records are written with the streak
// they would have had, and the stored ones are not written twice.
func TestHistoryFillsGapOfPartlyStoredBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	_, stop := f.leader(t, fast(supervisor.Config{}), nil)
	stop() // the consumers exist; nobody leads
	seqs := publishDeadEvents(t, f.js, 1, 5)
	for i := 4; i <= 5; i++ { // what the failed batch stored
		data, err := protocol.Marshal(&jetfleetpb.Execution{JobId: fmt.Sprintf("h-%02d", i), Queue: "default", Kind: "flaky",
			Status: protocol.EventDead, Reason: protocol.ReasonNonRetryable, ConsecutiveFailures: uint32(i), EventSequence: seqs[i-1]})
		require.NoError(t, err)
		_, err = f.js.Publish(fleettest.Ctx(t, 10*time.Second), protocol.HistoryKindSubject("default", "flaky"), data,
			jetstream.WithMsgID(fmt.Sprintf("history:%d:0", seqs[i-1])))
		require.NoError(t, err)
	}
	f.leader(t, fast(supervisor.Config{}), nil)
	publishDeadEvents(t, f.js, 6, 10)
	waitHistoryInOrder(t, f, 10)
}

package supervisor_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// webhook is a local HTTP server that fails the first failures requests
// and records every request.
type webhook struct {
	srv      *httptest.Server
	failures atomic.Int32

	mu       sync.Mutex
	requests []webhookRequest
	cond     chan struct{}
}

type webhookRequest struct {
	status int
	key    string
	id     string
	auth   string
	alert  *jetfleetpb.Alert
}

func newWebhook(t *testing.T, failFirst int) *webhook {
	t.Helper()
	w := &webhook{cond: make(chan struct{})}
	w.failures.Store(int32(failFirst))
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var al jetfleetpb.Alert
		_ = protocol.Unmarshal(body, &al)
		status := http.StatusOK
		if w.failures.Add(-1) >= 0 {
			status = http.StatusInternalServerError
		}
		w.mu.Lock()
		w.requests = append(w.requests, webhookRequest{status, al.GetKey(), r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), &al})
		close(w.cond)
		w.cond = make(chan struct{})
		w.mu.Unlock()
		rw.WriteHeader(status)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

// waitDelivered waits until n requests were answered 200.
func (w *webhook) waitDelivered(t *testing.T, n int, timeout time.Duration) []webhookRequest {
	t.Helper()
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		var ok []webhookRequest
		for _, r := range w.requests {
			if r.status == http.StatusOK {
				ok = append(ok, r)
			}
		}
		cond := w.cond
		w.mu.Unlock()
		if len(ok) >= n {
			return ok
		}
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("webhook: %d deliveries after %s, want %d", len(ok), timeout, n)
		}
	}
}

func (w *webhook) all() []webhookRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]webhookRequest(nil), w.requests...)
}

// dlqConsumerCaughtUp waits until the supervisor escalated every letter in DLQ.
func dlqConsumerCaughtUp(t *testing.T, f *fixture) {
	t.Helper()
	waitFor(t, 10*time.Second, "the supervisor to escalate every dead letter", func() bool {
		ctx := fleettest.Ctx(t, 5*time.Second)
		st, err := f.js.Stream(ctx, protocol.StreamDLQ)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		if err != nil {
			return false
		}
		c, err := f.js.Consumer(ctx, protocol.StreamDLQ, "supervisor")
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0 && ci.Delivered.Stream >= info.State.LastSeq
	})
}

// TestWebhookAlertRetriesAndDedupes: final failures of one kind within the
// dedupe window are one incident: one alert, on NATS and on the webhook,
// which answers 500 twice and is retried until it takes it. Another
// kind's failure is another incident.
func TestWebhookAlertRetriesAndDedupes(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	hook := newWebhook(t, 2)
	alerts := subscribe(t, f.nc, protocol.AlertsSubjects)
	f.leader(t, fast(supervisor.Config{Alerts: supervisor.AlertsConfig{DedupeWindow: time.Hour,
		Webhooks: map[string]supervisor.WebhookConfig{"ops": {URL: hook.srv.URL, Backoff: 20 * time.Millisecond, Timeout: 2 * time.Second,
			Headers: map[string]string{"Authorization": "Bearer s3cret"}}}}}), nil)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		for _, kind := range []string{"mail", "sms"} {
			must(t, a.Register(kind, func(context.Context, *agent.Job) error {
				return agent.NonRetryable(errors.New("smtp down"))
			}, agent.KindOptions{}))
		}
	})
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "mail"})
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventDead)
	}
	delivered := hook.waitDelivered(t, 1, 10*time.Second)
	dlqConsumerCaughtUp(t, f)
	reqs := hook.all()
	require.Len(t, reqs, 3, "two 500s, then the delivery")
	for _, r := range reqs {
		assert.Equal(t, "final_failure:default.mail", r.key)
		assert.Equal(t, delivered[0].id, r.id, "retries carry the same alert")
		assert.Equal(t, "Bearer s3cret", r.auth)
	}
	assert.Equal(t, []int{500, 500, 200}, []int{reqs[0].status, reqs[1].status, reqs[2].status})
	al := delivered[0].alert
	assert.Equal(t, protocol.SeverityCritical, al.GetSeverity())
	assert.Equal(t, "m-1", al.GetJobId(), "the first failure of the incident")
	assert.Contains(t, al.GetSummary(), "smtp down")
	m := alerts.next(t, 5*time.Second)
	assert.Equal(t, protocol.AlertSubject(protocol.SeverityCritical), m.Subject)

	fleettest.Publish(t, f.js, protocol.Job{ID: "s-1", Queue: "default", Kind: "sms"})
	second := hook.waitDelivered(t, 2, 10*time.Second)
	assert.Equal(t, "final_failure:default.sms", second[1].key)
	dlqConsumerCaughtUp(t, f)
	assert.Len(t, hook.all(), 4)
	select {
	case m := <-alerts.ch:
		var doc jetfleetpb.Alert
		require.NoError(t, protocol.Unmarshal(m.Data, &doc))
		assert.Equal(t, "final_failure:default.sms", doc.GetKey())
	case <-time.After(5 * time.Second):
		t.Fatal("no NATS alert for the second incident")
	}
	assert.Empty(t, alerts.ch, "one NATS alert per incident")
}

// TestAlertDedupeWindowOnInjectedClock: the same incident alerts again
// once the dedupe window has passed on the supervisor's clock, and a new
// leader keeps deduplicating.
func TestAlertDedupeWindowOnInjectedClock(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	hook := newWebhook(t, 0)
	clk := clock.NewFake(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	cfg := supervisor.Config{Alerts: supervisor.AlertsConfig{DedupeWindow: 10 * time.Minute,
		Webhooks: map[string]supervisor.WebhookConfig{"ops": {URL: hook.srv.URL}}}}
	s1, stop1 := f.leader(t, cfg, clk)
	ctx := fleettest.Ctx(t, 20*time.Second)
	raise := func(s *supervisor.Supervisor) bool {
		return s.RaiseAlert(ctx, &jetfleetpb.Alert{Key: "final_failure:default.mail", Type: "final_failure", Severity: protocol.SeverityWarning})
	}
	assert.True(t, raise(s1))
	clk.Advance(5 * time.Minute)
	assert.False(t, raise(s1), "inside the window")
	stop1()
	s2, _ := f.leader(t, cfg, clk)
	clk.Advance(4 * time.Minute)
	assert.False(t, raise(s2), "a new leader reads the incident from the stream")
	clk.Advance(2 * time.Minute)
	assert.True(t, raise(s2), "the window has passed")
	reqs := hook.waitDelivered(t, 2, 10*time.Second)
	assert.NotEqual(t, reqs[0].id, reqs[1].id)
}

// TestCircuitBreakerPausesQueueAndResumesAfterCoolDown: a burst of failed
// attempts opens the queue's breaker: its consumer is paused (visible in
// consumer info) and a breaker_opened event is published; after the
// cool-down the consumer is resumed, breaker_closed is published, and
// work flows again.
func TestCircuitBreakerPausesQueueAndResumesAfterCoolDown(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	queueEvents := subscribe(t, f.nc, protocol.QueueEventsSubjects)
	f.leader(t, fast(supervisor.Config{Breaker: supervisor.BreakerConfig{Default: supervisor.BreakerPolicy{
		FailureRate: 0.5, Window: time.Minute, MinSamples: 4, CoolDown: 2 * time.Second}}}), nil)
	var healthy atomic.Bool
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("fragile", func(context.Context, *agent.Job) error {
			if !healthy.Load() {
				return agent.Retry(errors.New("downstream 503"), time.Hour)
			}
			return nil
		}, agent.KindOptions{}))
	})
	for _, id := range []string{"x-1", "x-2", "x-3", "x-4"} {
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "fragile"})
	}
	m := queueEvents.next(t, 15*time.Second)
	assert.Equal(t, protocol.QueueEventSubject("default", protocol.EventBreakerOpened), m.Subject)
	var opened jetfleetpb.QueueEvent
	require.NoError(t, protocol.Unmarshal(m.Data, &opened))
	assert.Equal(t, uint32(4), opened.GetFailures())
	assert.InDelta(t, 1.0, opened.GetFailureRate(), 0.001)
	ctx := fleettest.Ctx(t, 30*time.Second)
	cons, err := f.js.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default"))
	require.NoError(t, err)
	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.True(t, info.Paused, "the consumer is paused")
	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	require.Len(t, status.Queues, 1)
	assert.Equal(t, "open", status.Queues[0].Breaker)

	healthy.Store(true)
	fleettest.Publish(t, f.js, protocol.Job{ID: "after", Queue: "default", Kind: "fragile"})
	m = queueEvents.next(t, 15*time.Second)
	assert.Equal(t, protocol.QueueEventSubject("default", protocol.EventBreakerClosed), m.Subject)
	info, err = cons.Info(ctx)
	require.NoError(t, err)
	assert.False(t, info.Paused, "resumed after the cool-down")
	ev := f.events.WaitFor(t, 10*time.Second, "after", protocol.EventSucceeded)
	assert.False(t, ev.GetTime().AsTime().Before(opened.GetUntil().AsTime()), "nothing ran while the breaker was open")
}

// TestScheduleAutoPausedAfterConsecutiveFailures: a schedule whose runs end
// dead three times in a row is paused through the scheduler, which
// publishes the paused event; its history shows the streak.
func TestScheduleAutoPausedAfterConsecutiveFailures(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	scheduleEvents := subscribe(t, f.nc, protocol.ScheduleEventSubject("nightly", protocol.EventPaused))
	env := fleettest.NewEnv(t, f.srv, f.topo)
	sched, err := scheduler.New(scheduler.Config{}, &service.Env{Name: "scheduler", Base: env.Base, Logger: env.Logger, Conn: env.Conn,
		JetStream: env.JetStream}, clock.Real())
	require.NoError(t, err)
	require.NoError(t, sched.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() { _ = sched.Stop(context.Background()) })
	f.leader(t, fast(supervisor.Config{Escalation: supervisor.EscalationConfig{
		Schedules: map[string]supervisor.EscalationPolicy{"nightly": {PauseScheduleAfter: 3}}}}), nil)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("report", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(errors.New("warehouse offline"))
		}, agent.KindOptions{}))
	})
	ctx := fleettest.Ctx(t, 30*time.Second)
	schedules := jetfleet.NewClient(f.nc)
	_, err = schedules.AddSchedule(ctx, &jetfleet.Schedule{ID: "nightly", Spec: jetfleet.Spec{Cron: "0 3 1 1 *"},
		Target: jetfleet.Target{Queue: "default", Kind: "report"}})
	require.NoError(t, err)
	for i := range 3 {
		res, err := schedules.TriggerSchedule(ctx, "nightly")
		require.NoError(t, err, "trigger %d", i)
		f.events.WaitFor(t, 10*time.Second, res.JobID, protocol.EventDead)
	}
	m := scheduleEvents.next(t, 10*time.Second)
	var ev jetfleetpb.ScheduleEvent
	require.NoError(t, protocol.Unmarshal(m.Data, &ev))
	assert.Equal(t, protocol.EventPaused, ev.GetType())
	assert.Contains(t, ev.GetReason(), "auto-paused by the supervisor after 3 failed runs in a row")
	info, err := schedules.GetSchedule(ctx, "nightly")
	require.NoError(t, err)
	assert.True(t, info.Schedule.Paused)

	hist, err := f.client.History(ctx, jetfleet.HistoryRequest{ScheduleID: "nightly"})
	require.NoError(t, err)
	assert.Equal(t, 3, hist.Stats.Executions)
	assert.Equal(t, 3, hist.Stats.ConsecutiveFailures)
	assert.Zero(t, hist.Stats.SuccessRate)
	recs, err := hist.Decode()
	require.NoError(t, err)
	assert.Equal(t, uint32(3), recs[0].GetConsecutiveFailures())
	assert.Equal(t, "warehouse offline", recs[0].GetError())
}

// TestCompensatingJob: a kind with a compensation policy gets a job of the
// compensating kind, with the failed job's payload and headers, when one
// of its jobs fails for good.
func TestCompensatingJob(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{Escalation: supervisor.EscalationConfig{Kinds: map[string]supervisor.EscalationPolicy{
		"reserve": {CompensateKind: "release", Alert: supervisor.SeverityNone}}}}), nil)
	got := make(chan *agent.Job, 2)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("reserve", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(errors.New("no stock"))
		}, agent.KindOptions{}))
		must(t, a.Register("release", func(_ context.Context, job *agent.Job) error {
			got <- &agent.Job{ID: job.ID, Payload: append([]byte(nil), job.Payload...), Headers: job.Headers}
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "order-7", Queue: "default", Kind: "reserve", Payload: []byte(`{"sku":"x"}`),
		Header: map[string][]string{"X-Tenant": {"acme"}}})
	var job *agent.Job
	select {
	case job = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("no compensating job")
	}
	assert.Equal(t, []byte(`{"sku":"x"}`), job.Payload)
	assert.Equal(t, "order-7", job.Headers.Get(protocol.HeaderCompensates))
	assert.Equal(t, protocol.ReasonNonRetryable, job.Headers.Get(protocol.HeaderDeadReason))
	assert.Contains(t, job.Headers.Get(protocol.HeaderDeadLetter), "DLQ:")
	assert.Equal(t, "acme", job.Headers.Get("X-Tenant"))
	dlqConsumerCaughtUp(t, f)
	assert.Empty(t, got, "one compensation")
}

// TestThresholdAlerts: the failure rate of a queue, the DLQ depth and a
// late schedule fire each raise their warning.
func TestThresholdAlerts(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	alerts := subscribe(t, f.nc, protocol.AlertSubject(protocol.SeverityWarning))
	f.leader(t, fast(supervisor.Config{Thresholds: supervisor.ThresholdsConfig{FailureRate: 0.5, MinSamples: 2, DLQDepth: 1,
		DLQDepthInterval: 100 * time.Millisecond, SchedulingDelay: 30 * time.Second},
		Escalation: supervisor.EscalationConfig{Default: supervisor.EscalationPolicy{Alert: supervisor.SeverityNone}}}), nil)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("bad", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(errors.New("bad"))
		}, agent.KindOptions{}))
	})
	for _, id := range []string{"t-1", "t-2"} {
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "bad"})
	}
	nominal := time.Now().Add(-time.Minute)
	data, err := protocol.Marshal(&jetfleetpb.ScheduleEvent{Type: protocol.EventFired, ScheduleId: "late", JobId: "sched.late.1",
		NominalTime: timestamppb.New(nominal), Time: timestamppb.Now()})
	require.NoError(t, err)
	_, err = f.js.Publish(fleettest.Ctx(t, 5*time.Second), protocol.ScheduleEventSubject("late", protocol.EventFired), data)
	require.NoError(t, err)

	seen := map[string]*jetfleetpb.Alert{}
	for len(seen) < 3 {
		var al jetfleetpb.Alert
		require.NoError(t, protocol.Unmarshal(alerts.next(t, 15*time.Second).Data, &al))
		seen[al.GetType()] = &al
	}
	require.Contains(t, seen, "failure_rate")
	assert.Equal(t, "default", seen["failure_rate"].GetQueue())
	assert.InDelta(t, 1.0, seen["failure_rate"].GetValue(), 0.001)
	require.Contains(t, seen, "dlq_depth")
	assert.Equal(t, 2.0, seen["dlq_depth"].GetValue())
	require.Contains(t, seen, "scheduling_delay")
	assert.Equal(t, "late", seen["scheduling_delay"].GetScheduleId())
	assert.InDelta(t, 60, seen["scheduling_delay"].GetValue(), 5)
}

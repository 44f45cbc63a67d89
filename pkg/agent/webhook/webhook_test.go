package webhook_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/webhook"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// request is what the test server received.
type request struct {
	at     time.Time
	header http.Header
	body   string
}

// server answers each job (by Jetfleet-Job-Id) with the next of its
// scripted responses; the last one repeats.
type server struct {
	*httptest.Server
	mu       sync.Mutex
	script   map[string][]func(w http.ResponseWriter, r *http.Request)
	requests map[string][]request
}

func newServer(t *testing.T) *server {
	s := &server{script: map[string][]func(http.ResponseWriter, *http.Request){}, requests: map[string][]request{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id := r.Header.Get("Jetfleet-Job-Id")
		s.mu.Lock()
		n := len(s.requests[id])
		s.requests[id] = append(s.requests[id], request{at: time.Now(), header: r.Header.Clone(), body: string(body)})
		steps := s.script[id]
		s.mu.Unlock()
		if len(steps) == 0 {
			http.Error(w, "no script for "+id, http.StatusTeapot)
			return
		}
		steps[min(n, len(steps)-1)](w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) on(id string, steps ...func(w http.ResponseWriter, r *http.Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script[id] = steps
}

func (s *server) got(id string) []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.requests[id]...)
}

func reply(status int, body string, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

type fixture struct {
	srv    *server
	js     jetstream.JetStream
	events *fleettest.Events
	env    *fleettest.Env
}

// setup starts a web server, a NATS server and an agent whose kind "hook"
// POSTs to the web server with cfg (its URL filled in).
func setup(t *testing.T, cfg webhook.Config) *fixture {
	t.Helper()
	web := newServer(t)
	nsrv := natstest.Server(t)
	env := fleettest.NewEnv(t, nsrv, topology.Config{})
	nc, js := natstest.JetStream(t, nsrv)
	f := &fixture{srv: web, js: js, events: fleettest.WatchJobEvents(t, nc), env: env}
	cfg.URL = web.URL + "/hooks/jobs"
	h, err := webhook.New(cfg)
	require.NoError(t, err)
	a, err := agent.New(env.Env.Conn, agent.Config{}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	require.NoError(t, a.Register("hook", h.Run, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(ctx))
		h.Close()
	})
	return f
}

func (f *fixture) publish(t *testing.T, job protocol.Job) {
	t.Helper()
	job.Queue, job.Kind = "default", "hook"
	fleettest.Publish(t, f.js, job)
}

func TestSuccessPostsPayloadAndMetadata(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{Headers: map[string]string{"Authorization": "Bearer s3cret"}})
	f.srv.on("ok-1", reply(http.StatusOK, "accepted"))
	f.publish(t, protocol.Job{ID: "ok-1", Payload: []byte(`{"to":"a@example.com"}`), Timeout: time.Minute, MaxAttempts: 4,
		ScheduleID: "daily", NominalTime: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)})
	ev := f.events.WaitFor(t, 30*time.Second, "ok-1", protocol.EventSucceeded)
	assert.Equal(t, "HTTP 200 OK\naccepted", ev.GetOutputTail())

	reqs := f.srv.got("ok-1")
	require.Len(t, reqs, 1)
	r := reqs[0]
	assert.Equal(t, `{"to":"a@example.com"}`, r.body)
	key := protocol.IdempotencyKey("ok-1", ev.GetStreamSequence())
	for k, want := range map[string]string{
		"Content-Type": "application/json", "Authorization": "Bearer s3cret", "Jetfleet-Job-Id": "ok-1",
		"Idempotency-Key": key, "Jetfleet-Attempt-Key": key + "#1", "Jetfleet-Queue": "default", "Jetfleet-Kind": "hook", "Jetfleet-Attempt": "1",
		"Jetfleet-Max-Attempts": "4", "Jetfleet-Schedule-Id": "daily", "Jetfleet-Nominal-Time": "2030-01-01T00:00:00Z",
	} {
		assert.Equal(t, want, r.header.Get(k), k)
	}
	deadline, err := time.Parse(time.RFC3339, r.header.Get("Jetfleet-Deadline"))
	require.NoError(t, err)
	assert.WithinDuration(t, r.at.Add(time.Minute), deadline, 15*time.Second)
	assert.Regexp(t, `^00-`+ev.GetTraceId()+`-[0-9a-f]{16}-0[01]$`, r.header.Get("traceparent"))
}

func TestServerErrorIsRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{})
	f.srv.on("e-1", reply(http.StatusInternalServerError, "database down"), reply(http.StatusNoContent, ""))
	f.publish(t, protocol.Job{ID: "e-1", Backoff: []time.Duration{100 * time.Millisecond}})
	retrying := f.events.WaitFor(t, 30*time.Second, "e-1", protocol.EventRetrying)
	assert.Contains(t, retrying.GetError(), "http status 500 Internal Server Error")
	assert.Equal(t, "HTTP 500 Internal Server Error\ndatabase down", retrying.GetOutputTail())
	ok := f.events.WaitFor(t, 30*time.Second, "e-1", protocol.EventSucceeded)
	assert.Equal(t, uint32(2), ok.GetAttempt())
	assert.Len(t, f.srv.got("e-1"), 2)
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{})
	f.srv.on("r-1", reply(http.StatusTooManyRequests, "slow down", "Retry-After", "1"), reply(http.StatusOK, "ok"))
	// The policy's backoff would retry at once: Retry-After wins.
	f.publish(t, protocol.Job{ID: "r-1", Backoff: []time.Duration{time.Millisecond}})
	retrying := f.events.WaitFor(t, 30*time.Second, "r-1", protocol.EventRetrying)
	assert.Equal(t, time.Second, retrying.GetRetryIn().AsDuration())
	assert.Contains(t, retrying.GetError(), "429")
	f.events.WaitFor(t, 30*time.Second, "r-1", protocol.EventSucceeded)
	reqs := f.srv.got("r-1")
	require.Len(t, reqs, 2)
	assert.GreaterOrEqual(t, reqs[1].at.Sub(reqs[0].at), 900*time.Millisecond, "the retry waited for Retry-After")
	assert.Equal(t, "2", reqs[1].header.Get("Jetfleet-Attempt"))
}

func TestClientErrorIsNotRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{})
	f.srv.on("bad-1", reply(http.StatusBadRequest, `{"error":"unknown recipient"}`))
	f.srv.on("moved-1", reply(http.StatusFound, "", "Location", "http://elsewhere.invalid/"))
	f.publish(t, protocol.Job{ID: "bad-1"})
	f.publish(t, protocol.Job{ID: "moved-1"})
	dead := f.events.WaitFor(t, 30*time.Second, "bad-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonNonRetryable, dead.GetReason())
	movedDead := f.events.WaitFor(t, 30*time.Second, "moved-1", protocol.EventDead)
	assert.Contains(t, movedDead.GetError(), `redirect to "http://elsewhere.invalid/" not followed`)
	assert.Len(t, f.srv.got("bad-1"), 1, "sent once")
	assert.Len(t, f.srv.got("moved-1"), 1, "sent once, the redirect not followed")
	var found bool
	for _, dl := range fleettest.DeadLetters(t, f.js) {
		if dl.GetJobId() == "bad-1" {
			found = true
			assert.Equal(t, "HTTP 400 Bad Request\n{\"error\":\"unknown recipient\"}", dl.GetOutputTail())
			assert.Contains(t, dl.GetLastError(), "http status 400 Bad Request")
		}
	}
	assert.True(t, found, "bad-1 is dead-lettered")
}

func TestRequestTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{RequestTimeout: 200 * time.Millisecond})
	f.srv.on("slow-1", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; the client gives up
	})
	f.publish(t, protocol.Job{ID: "slow-1", MaxAttempts: 2, Backoff: []time.Duration{time.Hour}})
	ev := f.events.WaitFor(t, 30*time.Second, "slow-1", protocol.EventRetrying)
	assert.Equal(t, protocol.CodeTimeout, ev.GetErrorCode())
	assert.Contains(t, ev.GetError(), "request timed out after 200ms")
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	err := webhook.Config{Headers: map[string]string{"Jetfleet-Job-Id": "x", "Content-Type": "text/plain"},
		RequestTimeout: -1, MaxRetryAfter: -1, MaxResponse: -1}.Validate("handlers.hook")
	for _, key := range []string{"url", "headers", "request_timeout", "max_retry_after", "max_response"} {
		assert.ErrorContains(t, err, "config key handlers.hook."+key+":")
	}
	for _, u := range []string{"ftp://host/x", "/relative", "http://"} {
		assert.ErrorContains(t, webhook.Config{URL: u}.Validate("h"), "config key h.url:", u)
	}
	assert.NoError(t, webhook.Config{URL: "https://user:pw@example.com/hook"}.Validate("h"))
}

// TestInterimResponsesReportProgress: an endpoint reports progress with 102
// Processing responses carrying Jetfleet-Progress before its final one.
func TestInterimResponsesReportProgress(t *testing.T) {
	t.Parallel()
	f := setup(t, webhook.Config{})
	f.srv.on("slow-1", func(w http.ResponseWriter, r *http.Request) {
		for _, v := range []string{"0.3 fetching", "soon", "0.6 rendering"} {
			w.Header().Set(webhook.HeaderProgress, v)
			w.WriteHeader(http.StatusProcessing)
			// The endpoint's work takes time: the agent publishes at most
			// one progress event a second.
			time.Sleep(1100 * time.Millisecond)
		}
		w.Header().Del(webhook.HeaderProgress)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "rendered")
	})
	f.publish(t, protocol.Job{ID: "slow-1"})
	ok := f.events.WaitFor(t, 30*time.Second, "slow-1", protocol.EventSucceeded)
	var progress []*jetfleetpb.JobEvent
	for _, ev := range f.events.All() {
		if ev.GetType() == protocol.EventProgress {
			progress = append(progress, ev)
		}
	}
	require.Len(t, progress, 2, "events: %v", f.events.Of("slow-1"))
	assert.Equal(t, 0.3, progress[0].GetProgress())
	assert.Equal(t, "fetching", progress[0].GetProgressMessage())
	assert.Equal(t, 0.6, progress[1].GetProgress())
	assert.Equal(t, "rendering", progress[1].GetProgressMessage())
	assert.Contains(t, ok.GetOutputTail(), `[jetfleet: Jetfleet-Progress header ignored: agent: invalid progress: "soon" is not a number from 0 to 1]`)
	assert.Contains(t, ok.GetOutputTail(), "HTTP 200 OK\nrendered")
}

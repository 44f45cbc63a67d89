package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// storedJob is the last job stored on subject. Queue nobody has no
// consumer, so the job stays in JOBS as submit published it.
func storedJob(t *testing.T, js jetstream.JetStream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, protocol.StreamJobs)
	require.NoError(t, err)
	msg, err := stream.GetLastMsgForSubject(ctx, subject)
	require.NoError(t, err)
	return msg
}

// TestSubmitTracesAndExports shows that submit sends traceparent, prints its
// trace id, and exports its spans over OTLP/HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT is set. Not parallel: it sets the environment.
func TestSubmitTracesAndExports(t *testing.T) {
	var mu sync.Mutex
	var exported []byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			exported = append(exported, body...)
			mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)

	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))

	// A JSON payload goes through the Go client's Enqueue.
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"submit", "-server", srv.ClientURL(), "-id", "traced-json", "nobody", "report",
		`{"a": 1, "html": "<b>"}`}, &out))
	traceID := printedTraceID(t, out.String())
	msg := storedJob(t, js, "jobs.nobody.report")
	assert.Equal(t, "traced-json", msg.Header.Get(protocol.HeaderJobID))
	assert.Regexp(t, "^00-"+traceID+"-[0-9a-f]{16}-01$", telemetry.HeaderCarrier(msg.Header).Get("traceparent"))
	assert.Equal(t, `{"a":1,"html":"\u003cb\u003e"}`, string(msg.Data), "compacted by encoding/json, the same JSON value")

	// Shutting the tracer provider down at the end of submit exported the spans.
	mu.Lock()
	got := append([]byte(nil), exported...)
	mu.Unlock()
	rawID, err := hex.DecodeString(traceID)
	require.NoError(t, err)
	assert.True(t, bytes.Contains(got, rawID), "the collector received the trace")
	assert.Contains(t, string(got), "jetfleet submit")
	assert.Contains(t, string(got), "jetfleet.enqueue report", "the producer span of pkg/jetfleet's Enqueue")

	// Any other payload is published byte for byte, with the same trace context.
	out.Reset()
	const payload = "plain <text>\n"
	require.NoError(t, run(ctx, []string{"submit", "-server", srv.ClientURL(), "-o", "json", "-header", "X-Note=raw", "nobody", "raw",
		payload}, &out))
	var res submitted
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	assert.NotEmpty(t, res.JobID, "a unique job id, as Enqueue makes")
	assert.Equal(t, "jobs.nobody.raw", res.Subject)
	msg = storedJob(t, js, "jobs.nobody.raw")
	assert.Equal(t, payload, string(msg.Data))
	assert.Equal(t, res.JobID, msg.Header.Get(protocol.HeaderJobID))
	assert.Equal(t, "raw", msg.Header.Get("X-Note"))
	assert.Regexp(t, "^00-"+res.TraceID+"-[0-9a-f]{16}-01$", telemetry.HeaderCarrier(msg.Header).Get("traceparent"))
	mu.Lock()
	rawID, _ = hex.DecodeString(res.TraceID)
	assert.True(t, bytes.Contains(exported, rawID), "the raw publish's trace is exported too")
	mu.Unlock()
}

// TestSubmitWithPassword connects with -user and a password from
// $NATS_PASSWORD or -password. Not parallel: it sets the environment.
func TestSubmitWithPassword(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "auth.conf")
	require.NoError(t, os.WriteFile(conf, []byte("authorization { user: bob, password: hunter2 }\n"), 0o600))
	srv := natstest.ServerWith(t, embedded.Options{ConfigFile: conf})
	nc := natstest.Connect(t, srv, nats.UserInfo("bob", "hunter2"))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	for _, name := range []string{"NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY", "NATS_URL"} {
		t.Setenv(name, "")
	}
	submit := func(args ...string) error {
		full := append([]string{"submit", "-server", srv.ClientURL(), "-timeout", "5s"}, args...)
		return run(ctx, append(full, "nobody", "report", `{}`), io.Discard)
	}

	assert.ErrorContains(t, submit("-user", "bob"), "Authorization Violation", "no password")
	assert.ErrorContains(t, submit("-user", "bob", "-password", "wrong"), "Authorization Violation")
	require.NoError(t, submit("-user", "bob", "-password", "hunter2"))
	t.Setenv("NATS_PASSWORD", "hunter2")
	require.NoError(t, submit("-user", "bob"), "the password from $NATS_PASSWORD")
	t.Setenv("NATS_USER", "bob")
	require.NoError(t, submit(), "both from the environment")
}

// TestSubmitUnique: -unique-key claims the key; a second submit of it
// publishes nothing and names the job that holds it; bad values are refused.
func TestSubmitUnique(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	submit := func(args ...string) (submitted, error) {
		var out bytes.Buffer
		full := append([]string{"submit", "-server", srv.ClientURL(), "-o", "json"}, args...)
		err := run(ctx, append(full, "nobody", "report", `{}`), &out)
		var res submitted
		if err == nil {
			require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
		}
		return res, err
	}
	first, err := submit("-id", "report-1", "-unique-key", "acme", "-unique-until-finished")
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	again, err := submit("-id", "report-2", "-unique-key", "acme", "-unique-for", "1h")
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, "report-1", again.JobID)
	assert.Equal(t, protocol.UniqueClaimKey("nobody", "report", "acme"), storedJob(t, js, "jobs.nobody.report").Header.Get(protocol.HeaderUniqueKey))

	_, err = submit("-unique-key", "acme")
	assert.ErrorContains(t, err, "needs a period or until-finished")
	_, err = submit("-unique-for", "-1s", "-unique-key", "x")
	assert.ErrorContains(t, err, "is negative")
	_, err = submit("-unique-until-finished")
	assert.ErrorContains(t, err, "unique key is empty")
}

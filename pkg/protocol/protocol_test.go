package protocol_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

func TestParseAckSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		subject string
		want    protocol.AckSubject
		wantErr bool
	}{
		{
			name:    "v1",
			subject: "$JS.ACK.JOBS.queue-default.3.42.17.1700000000000000000.5",
			want: protocol.AckSubject{Stream: "JOBS", Consumer: "queue-default", Delivered: 3, StreamSequence: 42,
				ConsumerSequence: 17, Timestamp: time.Unix(0, 1700000000000000000).UTC(), Pending: 5},
		},
		{
			name:    "v2 with domain, hash and token",
			subject: "$JS.ACK.hub.ACCHASH.JOBS.queue-default.1.7.8.1700000000000000000.0.XyZ",
			want: protocol.AckSubject{Domain: "hub", AccountHash: "ACCHASH", Stream: "JOBS", Consumer: "queue-default",
				Delivered: 1, StreamSequence: 7, ConsumerSequence: 8, Timestamp: time.Unix(0, 1700000000000000000).UTC()},
		},
		{
			name:    "v2 without domain and without token",
			subject: "$JS.ACK._.ACCHASH.JOBS.c.2.9.9.1.0",
			want: protocol.AckSubject{AccountHash: "ACCHASH", Stream: "JOBS", Consumer: "c", Delivered: 2,
				StreamSequence: 9, ConsumerSequence: 9, Timestamp: time.Unix(0, 1).UTC()},
		},
		{name: "wrong prefix", subject: "$JS.NAK.JOBS.c.1.1.1.1.1", wantErr: true},
		{name: "too few tokens", subject: "$JS.ACK.JOBS.c.1.1.1", wantErr: true},
		{name: "ten tokens", subject: "$JS.ACK.a.b.JOBS.c.1.1.1.1", wantErr: true},
		{name: "non numeric", subject: "$JS.ACK.JOBS.c.x.1.1.1.1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := protocol.ParseAckSubject(tt.subject)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestJobRoundTrip(t *testing.T) {
	t.Parallel()
	nominal := time.Date(2026, 3, 29, 1, 30, 0, 0, time.UTC)
	job := protocol.Job{
		ID: "order-42", Queue: "default", Kind: "send-email", Payload: []byte(`{"to":"a@b.c"}`),
		Timeout: 90 * time.Second, MaxAttempts: 4, Backoff: []time.Duration{time.Second, 10 * time.Second},
		ScheduleID: "nightly", NominalTime: nominal, ReplayedFrom: "DLQ:7",
		Header: nats.Header{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
	}
	msg, err := job.Msg()
	require.NoError(t, err)
	assert.Equal(t, "jobs.default.send-email", msg.Subject)
	assert.Equal(t, "order-42", msg.Header.Get(protocol.HeaderMsgID), "job id doubles as the idempotency key")
	assert.Equal(t, "1m30s", msg.Header.Get(protocol.HeaderTimeout))

	got, err := protocol.ParseJob(msg.Subject, msg.Header, msg.Data)
	require.NoError(t, err)
	assert.Equal(t, job.ID, got.ID)
	assert.Equal(t, job.Queue, got.Queue)
	assert.Equal(t, job.Kind, got.Kind)
	assert.Equal(t, job.Timeout, got.Timeout)
	assert.Equal(t, job.MaxAttempts, got.MaxAttempts)
	assert.Equal(t, job.Backoff, got.Backoff)
	assert.Equal(t, job.ScheduleID, got.ScheduleID)
	assert.True(t, nominal.Equal(got.NominalTime))
	assert.Equal(t, job.ReplayedFrom, got.ReplayedFrom)
	assert.Equal(t, job.Payload, got.Payload)
}

func TestParseJobFallsBackToMsgID(t *testing.T) {
	t.Parallel()
	got, err := protocol.ParseJob("jobs.q.k", nats.Header{protocol.HeaderMsgID: {"dedupe-1"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, "dedupe-1", got.ID)

	got, err = protocol.ParseJob("jobs.q.k", nil, nil)
	require.NoError(t, err)
	assert.Empty(t, got.ID, "the caller assigns FallbackJobID from the stream sequence")
	assert.Equal(t, "JOBS-12", protocol.FallbackJobID(12))
}

func TestParseJobReportsEveryBadHeader(t *testing.T) {
	t.Parallel()
	h := nats.Header{
		protocol.HeaderJobID:       {"ok-id"},
		protocol.HeaderTimeout:     {"soon"},
		protocol.HeaderMaxAttempts: {"0"},
		protocol.HeaderBackoff:     {"1s,x"},
		protocol.HeaderNominalTime: {"yesterday"},
	}
	got, err := protocol.ParseJob("jobs.default.echo", h, []byte("x"))
	require.Error(t, err)
	var headerErrs []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var he *protocol.HeaderError
		require.True(t, errors.As(e, &he), "every error is a *HeaderError: %v", e)
		headerErrs = append(headerErrs, he.Header)
	}
	assert.ElementsMatch(t, []string{protocol.HeaderTimeout, protocol.HeaderMaxAttempts, protocol.HeaderBackoff, protocol.HeaderNominalTime}, headerErrs)
	assert.Equal(t, "ok-id", got.ID, "what could be read is kept for the dead letter")
	assert.Equal(t, "echo", got.Kind)
}

func TestParseJobRejectsBadSubject(t *testing.T) {
	t.Parallel()
	for _, subject := range []string{"jobs.default", "jobs.a.b.c", "dlq.a.b", "jobs.a b.c"} {
		_, err := protocol.ParseJob(subject, nil, nil)
		assert.Error(t, err, subject)
	}
}

func TestJobValidate(t *testing.T) {
	t.Parallel()
	_, err := protocol.Job{Queue: "default", Kind: "a.b"}.Msg()
	assert.ErrorContains(t, err, "invalid kind")
	_, err = protocol.Job{Queue: "", Kind: "echo"}.Msg()
	assert.ErrorContains(t, err, "invalid queue")
	_, err = protocol.Job{Queue: "q", Kind: "k", ID: "has space"}.Msg()
	assert.ErrorContains(t, err, "job id")
}

func TestJobToken(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "order-42", protocol.JobToken("order-42"))
	assert.Equal(t, "b64_c2NoZWQ6eDox", protocol.JobToken("sched:x:1"))
	for _, id := range []string{"sched.nightly.1700000000", "a b", "a*", "a>", "b64_x", "ü", ""} {
		tok := protocol.JobToken(id)
		assert.NotContains(t, tok, ".", id)
		assert.NotEqual(t, id, tok)
		assert.Equal(t, id, protocol.JobIDOfToken(tok), "a token gives its id back")
	}
	assert.Equal(t, "order-42", protocol.JobIDOfToken("order-42"))
	assert.NotEqual(t, protocol.JobToken("a:b"), protocol.JobToken("a;b"))
	assert.Equal(t, "events.job.default.echo.succeeded.order-42", protocol.JobEventSubject("default", "echo", "succeeded", "order-42"))
	assert.Equal(t, "events.job.*.*.*.order-42", protocol.JobEventsOfID("order-42"))
}

func TestCodecUsesSnakeCaseAndAcceptsCamelCase(t *testing.T) {
	t.Parallel()
	hb := &jetfleetpb.Heartbeat{
		AgentId:  "agent-1",
		Interval: durationpb.New(time.Second),
		SentAt:   timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		Jobs:     []*jetfleetpb.InFlightJob{{JobId: "j1", ReplySubject: "$JS.ACK.JOBS.c.1.1.1.1.0", StreamSequence: 1}},
	}
	data, err := protocol.Marshal(hb)
	require.NoError(t, err)
	assert.Contains(t, string(data), `"agent_id":"agent-1"`)
	assert.Contains(t, string(data), `"interval":"1s"`)
	assert.Contains(t, string(data), `"sent_at":"2026-01-02T03:04:05Z"`)

	var got jetfleetpb.Heartbeat
	require.NoError(t, protocol.Unmarshal([]byte(`{"agentId":"a2","jobs":[{"job_id":"x","stream_sequence":5}],"future_field":1}`), &got))
	assert.Equal(t, "a2", got.GetAgentId())
	assert.Equal(t, uint64(5), got.GetJobs()[0].GetStreamSequence(), "64-bit integers are read from JSON numbers too")

	assert.Error(t, protocol.Unmarshal([]byte(`{"agent_id":`), &got))
}

func TestErrorMatchesByCode(t *testing.T) {
	t.Parallel()
	err := protocol.FromDoc(protocol.ToDoc(protocol.FieldError("spec.cron", "bad spec")))
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)))
	assert.False(t, errors.Is(err, protocol.Code(protocol.CodeNotFound)))
	var pe *protocol.Error
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, "spec.cron", pe.Field)
	assert.Nil(t, protocol.FromDoc(&jetfleetpb.Error{}))
	assert.Equal(t, protocol.CodeInternal, protocol.ToDoc(errors.New("boom")).GetCode())
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	q, k, err := protocol.ParseDLQSubject(protocol.DLQSubject("default", "echo"))
	require.NoError(t, err)
	assert.Equal(t, []string{"default", "echo"}, []string{q, k})
	id, err := protocol.ParseHeartbeatSubject(protocol.HeartbeatSubject("agent-7"))
	require.NoError(t, err)
	assert.Equal(t, "agent-7", id)
	_, err = protocol.ParseHeartbeatSubject("jetfleet.agents.x.control")
	assert.Error(t, err)
	assert.Equal(t, "queue-default", protocol.QueueConsumer("default"))
	assert.Equal(t, `-NAK {"delay": 1500000000}`, protocol.NakWithDelayBody(1500*time.Millisecond))
}

func TestParseJobSubject(t *testing.T) {
	q, k, err := protocol.ParseJobSubject(protocol.JobSubject("default", "send_email"))
	require.NoError(t, err)
	assert.Equal(t, []string{"default", "send_email"}, []string{q, k})
	for _, bad := range []string{"", "jobs", "jobs.", "jobs.default", "jobs.default.", "jobs..echo", "jobs.a.b.c",
		"jobsx.default.echo", "dlq.default.echo", "jobs.default.e*", ".jobs.default.echo"} {
		_, _, err := protocol.ParseJobSubject(bad)
		assert.Error(t, err, "%q", bad)
	}
	allocs := testing.AllocsPerRun(100, func() { _, _, _ = protocol.ParseJobSubject("jobs.default.send_email") })
	assert.Zero(t, allocs, "every delivered job is parsed: no allocation")
}

func TestValidateToken(t *testing.T) {
	for _, ok := range []string{"a", "default", "Order_Kind-2", strings.Repeat("x", 128)} {
		assert.NoError(t, protocol.ValidateToken("queue", ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("x", 129), "a.b", "a b", "a*", "a>", "é", "a=b", "a/b", "a\x00"} {
		err := protocol.ValidateToken("queue", bad)
		if assert.Error(t, err, "%q", bad) {
			assert.Contains(t, err.Error(), "invalid queue")
		}
	}
	assert.Equal(t, "b64_", protocol.JobToken(""), "an empty id still makes one token")
	assert.Equal(t, "a=b", protocol.JobToken("a=b"))
}

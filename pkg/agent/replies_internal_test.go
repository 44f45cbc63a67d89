package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/natstest"
)

// answer records what a waiter was told.
type answer struct {
	body []byte
	err  error
}

type chanWaiter chan answer

func (c chanWaiter) answered(body []byte, err error) { c <- answer{body, err} }

// TestRepliesRouteAnswersAndExpireTheUnanswered sends three messages through
// one replies: one answered, one to a subject nobody serves, one to a
// responder that never answers. Each waiter is told exactly once, and
// nothing is left waiting.
func TestRepliesRouteAnswersAndExpireTheUnanswered(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, _ := natstest.JetStream(t, srv)
	echo, err := nc.Subscribe("svc.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("re: "), m.Data...)) })
	require.NoError(t, err)
	defer func() { _ = echo.Unsubscribe() }()
	silent, err := nc.Subscribe("svc.silent", func(*nats.Msg) {})
	require.NoError(t, err)
	defer func() { _ = silent.Unsubscribe() }()
	require.NoError(t, nc.Flush())

	r, err := newReplies(nc, 300*time.Millisecond)
	require.NoError(t, err)
	go r.expireLoop(t.Context())

	answered, unserved, unanswered := make(chanWaiter, 2), make(chanWaiter, 2), make(chanWaiter, 2)
	sentAt := time.Now()
	require.NoError(t, r.send(&nats.Msg{Subject: "svc.echo", Data: []byte("hi")}, answered))
	require.NoError(t, r.send(&nats.Msg{Subject: "svc.nobody"}, unserved))
	require.NoError(t, r.send(&nats.Msg{Subject: "svc.silent"}, unanswered))

	a := <-answered
	require.NoError(t, a.err)
	assert.Equal(t, "re: hi", string(a.body))
	a = <-unserved
	assert.ErrorIs(t, a.err, errNoResponders)
	a = <-unanswered
	assert.ErrorIs(t, a.err, errNoAnswer)
	assert.GreaterOrEqual(t, time.Since(sentAt), 300*time.Millisecond, "expired only after the timeout")
	assert.Zero(t, r.close(), "nothing left waiting")
	assert.Empty(t, answered, "told once")
	assert.Empty(t, unserved, "told once")
	assert.Empty(t, unanswered, "told once")
}

func TestPubAckError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body    string
		wantErr string // "" for stored
	}{
		{`{"stream":"EVENTS","seq":42}`, ""},
		{`{"stream":"EVENTS","seq":42,"duplicate":true}`, ""},
		{`{"stream":"EVENTS","domain":"hub","seq":7}`, ""},
		{`{"stream":"error","seq":3}`, ""}, // a stream named "error" is still a stored message
		{`{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}`, "maximum messages exceeded (code 503, error code 10077)"},
		{`{"stream":"EVENTS","error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`, "wrong last sequence: 3"},
		{`{"stream":"EVENTS"}`, "unexpected publish ack"},
		{`not json`, "unreadable publish ack"},
		{``, "unreadable publish ack"},
	} {
		err := pubAckError([]byte(tc.body))
		if tc.wantErr == "" {
			assert.NoError(t, err, tc.body)
			continue
		}
		require.Error(t, err, tc.body)
		assert.Contains(t, err.Error(), tc.wantErr, tc.body)
		assert.False(t, errors.Is(err, errNoAnswer))
	}
}

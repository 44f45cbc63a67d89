package protocol_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func FuzzParseAckSubject(f *testing.F) {
	f.Add("$JS.ACK.JOBS.queue-default.3.42.17.1700000000000000000.5")
	f.Add("$JS.ACK.hub.H.JOBS.c.1.7.8.1.0.tok")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := protocol.ParseAckSubject(s)
		if err == nil && (a.Stream == "" || a.Consumer == "") {
			t.Fatalf("accepted %q without stream or consumer", s)
		}
	})
}

func FuzzParseJob(f *testing.F) {
	f.Add("jobs.default.echo", "30s", "3", "1s,2s", "2026-01-01T00:00:00Z", []byte("{}"))
	f.Fuzz(func(t *testing.T, subject, timeout, attempts, backoff, nominal string, payload []byte) {
		h := nats.Header{}
		h.Set(protocol.HeaderTimeout, timeout)
		h.Set(protocol.HeaderMaxAttempts, attempts)
		h.Set(protocol.HeaderBackoff, backoff)
		h.Set(protocol.HeaderNominalTime, nominal)
		j, err := protocol.ParseJob(subject, h, payload)
		if err == nil {
			if j.Timeout < 0 || j.MaxAttempts < 0 {
				t.Fatalf("accepted negative values: %+v", j)
			}
			if _, err := j.Msg(); err != nil {
				t.Fatalf("a parsed job does not re-encode: %v", err)
			}
		}
	})
}

func FuzzJobToken(f *testing.F) {
	f.Add("sched:x:1")
	f.Fuzz(func(t *testing.T, id string) {
		tok := protocol.JobToken(id)
		if tok == "" || strings.ContainsAny(tok, ". *>\t\r\n") {
			t.Fatalf("JobToken(%q) = %q is not one subject token", id, tok)
		}
	})
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The permissions matrix: every NATS user of the stack (config/nats/
// accounts.conf) tries, on the cluster, actions its role must not do and
// actions it needs. A forbidden action must be refused by the server (a
// permissions violation naming the subject); a needed one must be answered.
// Forbidden actions aim at a stream made for the probe (CHAOS_PROBE) or at
// keys no service uses, so that one wrongly allowed harms nothing.

// probeStream is the stream the forbidden stream operations target.
const probeStream = "CHAOS_PROBE"

// noSuchServer is the body of the step-downs the matrix asks for: in favour
// of a server that does not exist, which the server refuses ("preferred
// server not known") once it has let the user ask, so no leader moves.
const noSuchServer = `{"placement":{"preferred":"chaos-no-such-server"}}`

// action is one cell of the matrix.
type action struct {
	what    string
	subject string
	// request: wait for an answer (a JetStream API call or a service);
	// otherwise a plain publish.
	request bool
	body    string
}

// matrix lists, per user, what it must not do and what it needs.
var matrix = []struct {
	user      string
	forbidden []action
	needed    []action
}{
	{"scheduler",
		[]action{
			{"delete a stream", "$JS.API.STREAM.DELETE." + probeStream, true, ""},
			{"purge a stream", "$JS.API.STREAM.PURGE." + probeStream, true, ""},
			{"delete a queue's consumer", "$JS.API.CONSUMER.DELETE.JOBS.chaos-probe", true, ""},
			{"ack on JOBS (an agent's consumer)", "$JS.ACK.JOBS.chaos-probe.1.1.1.1.1", false, "+ACK"},
			{"publish a job event", "events.job.chaos-probe.succeeded", false, "{}"},
			{"write an agent's registration", "$KV.agents.chaos-probe", false, "{}"},
			{"step down the leader of a stream it does not fire through", "$JS.API.STREAM.LEADER.STEPDOWN." + probeStream, true, noSuchServer},
		},
		[]action{
			{"stream info", "$JS.API.STREAM.INFO.JOBS", true, ""},
			{"read its schedules (direct get)", "$JS.API.DIRECT.GET.KV_schedules.$KV.schedules.chaos-probe", true, ""},
			// the leader keeps the fire path's leaders off its own server
			{"step down the leader of EVENTS", "$JS.API.STREAM.LEADER.STEPDOWN.EVENTS", true, noSuchServer},
		}},
	{"supervisor",
		[]action{
			{"delete a stream", "$JS.API.STREAM.DELETE." + probeStream, true, ""},
			{"write a schedule", "$KV.schedules.chaos-probe", false, "{}"},
			{"write a schedule's state", "$KV.schedule_state.chaos-probe", false, "{}"},
			{"publish a schedule event", "events.schedule.chaos-probe.fired", false, "{}"},
			{"purge a stream", "$JS.API.STREAM.PURGE." + probeStream, true, ""},
			{"delete an event (message delete on EVENTS)", "$JS.API.STREAM.MSG.DELETE.EVENTS", true, `{"seq":1}`},
		},
		[]action{
			{"stream info", "$JS.API.STREAM.INFO.JOBS", true, ""},
			{"consumer names of JOBS", "$JS.API.CONSUMER.NAMES.JOBS", true, "{}"},
			// jetfleet queue rm; the consumer does not exist, so nothing goes
			{"delete a queue's consumer", "$JS.API.CONSUMER.DELETE.JOBS.chaos-probe", true, ""},
		}},
	{"agent",
		[]action{
			{"delete a stream", "$JS.API.STREAM.DELETE." + probeStream, true, ""},
			{"create a stream", "$JS.API.STREAM.CREATE.CHAOS_PROBE_2", true, `{"name":"CHAOS_PROBE_2","subjects":["chaos.probe2"]}`},
			{"purge a stream", "$JS.API.STREAM.PURGE." + probeStream, true, ""},
			{"delete a message", "$JS.API.STREAM.MSG.DELETE." + probeStream, true, `{"seq":1}`},
			{"publish a job", "jobs.default.chaos-probe", false, "{}"},
			{"write a schedule", "$KV.schedules.chaos-probe", false, "{}"},
			{"take the scheduler lease", "$KV.leases.chaos-probe", false, "{}"},
			{"write a limit's definition", "$KV.limits.def.default.chaos-probe", false, "{}"},
			{"read schedules (direct get)", "$JS.API.DIRECT.GET.KV_schedules.$KV.schedules.chaos-probe", true, ""},
			{"read every job (direct get on JOBS)", "$JS.API.DIRECT.GET.JOBS", true, `{"seq":1}`},
			{"ack on another consumer (supervisor's)", "$JS.ACK.EVENTS.supervisor.1.1.1.1.1", false, "+ACK"},
			{"call the scheduler API", "jetfleet.api.scheduler.ls", true, "{}"},
			{"step down the leader of JOBS", "$JS.API.STREAM.LEADER.STEPDOWN.JOBS", true, noSuchServer},
		},
		[]action{
			{"stream info", "$JS.API.STREAM.INFO.JOBS", true, ""},
			{"read events (direct get)", "$JS.API.DIRECT.GET.EVENTS.events.job.chaos-probe.>", true, ""},
			{"read a job's events from the leader (message get)", "$JS.API.STREAM.MSG.GET.EVENTS", true, `{"last_by_subj":"events.job.chaos-probe.>"}`},
			{"read limits (direct get)", "$JS.API.DIRECT.GET.KV_limits.$KV.limits.def.default.chaos-probe", true, ""},
		}},
	{"dashboard",
		[]action{
			{"delete a stream", "$JS.API.STREAM.DELETE." + probeStream, true, ""},
			{"publish a job", "jobs.default.chaos-probe", false, "{}"},
			{"publish a job event", "events.job.chaos-probe.succeeded", false, "{}"},
			{"write a schedule", "$KV.schedules.chaos-probe", false, "{}"},
			{"ack on JOBS", "$JS.ACK.JOBS.chaos-probe.1.1.1.1.1", false, "+ACK"},
			{"read cancels (direct get)", "$JS.API.DIRECT.GET.KV_cancels.$KV.cancels.chaos-probe", true, ""},
		},
		[]action{
			{"stream info", "$JS.API.STREAM.INFO.EVENTS", true, ""},
			{"read events (direct get)", "$JS.API.DIRECT.GET.EVENTS.events.job.chaos-probe.>", true, ""},
		}},
	{"client",
		[]action{
			{"delete a stream", "$JS.API.STREAM.DELETE." + probeStream, true, ""},
			{"delete a job (message delete on JOBS)", "$JS.API.STREAM.MSG.DELETE.JOBS", true, `{"seq":1}`},
			{"write a schedule", "$KV.schedules.chaos-probe", false, "{}"},
			{"take the scheduler lease", "$KV.leases.chaos-probe", false, "{}"},
			{"publish a job event", "events.job.chaos-probe.succeeded", false, "{}"},
			{"ack on JOBS", "$JS.ACK.JOBS.chaos-probe.1.1.1.1.1", false, "+ACK"},
			{"read agents (direct get)", "$JS.API.DIRECT.GET.KV_agents.$KV.agents.chaos-probe", true, ""},
		},
		[]action{
			{"stream info", "$JS.API.STREAM.INFO.EVENTS", true, ""},
			{"read events (direct get)", "$JS.API.DIRECT.GET.EVENTS.events.job.chaos-probe.>", true, ""},
			{"call the scheduler API", "jetfleet.api.scheduler.ls", true, "{}"},
		}},
}

// verdict is what the server did with one action.
type verdict string

const (
	refused  verdict = "refused"
	answered verdict = "allowed"
	silent   verdict = "no answer"
)

// runPermissions tries the matrix on the stack and fills the row; the
// matrix itself is printed by the table (notes).
func runPermissions(ctx context.Context, _ *runEnv, s *stack, r *row) error {
	if _, err := s.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: probeStream, Subjects: []string{"chaos.probe"},
		Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("stream %s: %w", probeStream, err)
	}
	if _, err := s.js.Publish(ctx, "chaos.probe", []byte("probe")); err != nil {
		return err
	}
	forbidden, needed, refusedOK, allowedOK := 0, 0, 0, 0
	for _, m := range matrix {
		p, err := newProber(s.urls, m.user, s.passwords[strings.ToUpper(m.user)+"_NATS_PASSWORD"])
		if err != nil {
			return err
		}
		for _, a := range m.forbidden {
			forbidden++
			if v := p.try(ctx, a); v == refused {
				refusedOK++
			} else {
				r.fail("%s may %s (%s): %s", m.user, a.what, a.subject, v)
			}
		}
		for _, a := range m.needed {
			needed++
			if v := p.try(ctx, a); v == answered {
				allowedOK++
			} else {
				r.fail("%s may not %s (%s): %s", m.user, a.what, a.subject, v)
			}
		}
		r.note("%-10s refused: %s; allowed: %s", m.user, whats(m.forbidden), whats(m.needed))
		p.close()
	}
	// What a wrongly allowed action would have changed.
	if _, err := s.js.Stream(ctx, probeStream); err != nil {
		r.fail("stream %s is gone: %v", probeStream, err)
	}
	r.faults = fmt.Sprintf("%d users × their forbidden and needed actions", len(matrix))
	r.load = "-"
	r.recover = fmt.Sprintf("%d/%d forbidden refused, %d/%d needed allowed", refusedOK, forbidden, allowedOK, needed)
	return s.js.DeleteStream(ctx, probeStream)
}

func whats(as []action) string {
	var w []string
	for _, a := range as {
		w = append(w, a.what)
	}
	return strings.Join(w, ", ")
}

// prober is one user's connection; it tells refusals from answers.
type prober struct {
	nc *nats.Conn
	mu sync.Mutex
	// violations are the subjects the server refused, as it said them.
	violations []string
	changed    chan struct{}
}

func newProber(urls []string, user, password string) (*prober, error) {
	p := &prober{changed: make(chan struct{}, 1)}
	nc, err := connectHost(urls, user, password, "chaos-probe-"+user,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
				p.mu.Lock()
				p.violations = append(p.violations, err.Error())
				p.mu.Unlock()
				select {
				case p.changed <- struct{}{}:
				default:
				}
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", user, err)
	}
	p.nc = nc
	return p, nil
}

func (p *prober) close() { p.nc.Close() }

func (p *prober) refusedSubject(subject string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.violations, func(v string) bool { return strings.Contains(v, `"`+subject+`"`) })
}

// try runs a: refused when the server reports a permissions violation
// for its subject, allowed when it answers (requests) or stays quiet for a
// second after a flush (publishes).
func (p *prober) try(ctx context.Context, a action) verdict {
	inbox := p.nc.NewRespInbox()
	replies, err := p.nc.SubscribeSync(inbox)
	if err != nil {
		return silent
	}
	defer func() { _ = replies.Unsubscribe() }()
	msg := nats.NewMsg(a.subject)
	msg.Data = []byte(a.body)
	if a.request {
		msg.Reply = inbox
	}
	if err := p.nc.PublishMsg(msg); err != nil {
		return silent
	}
	_ = p.nc.FlushTimeout(5 * time.Second)
	deadline := time.After(3 * time.Second)
	for {
		if p.refusedSubject(a.subject) {
			return refused
		}
		if a.request {
			if _, err := replies.NextMsg(100 * time.Millisecond); err == nil {
				return answered
			} else if !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, io.EOF) {
				return silent
			}
		}
		select {
		case <-ctx.Done():
			return silent
		case <-deadline:
			if a.request {
				return silent
			}
			return answered // published, and the server said nothing against it
		case <-p.changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

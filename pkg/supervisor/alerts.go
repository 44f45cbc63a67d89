package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// incidentSubject records when an alert was last sent for an incident key,
// so a new leader keeps deduplicating.
func incidentSubject(key string) string {
	return "jetfleet.supervisor.incidents." + protocol.JobToken(key)
}

// alerter sends alerts on jetfleet.alerts.<severity> and to the configured
// webhooks, once per incident key per dedupe window.
type alerter struct {
	s      *Supervisor
	client *http.Client
	// deliveries outlive the leadership that raised them, until stop.
	ctx        context.Context
	cancel     context.CancelFunc
	deliveries sync.WaitGroup

	mu   sync.Mutex
	last map[string]time.Time // incident key → when its alert was sent, within the dedupe window
	// pruned is when last was last cleared of entries past the window.
	pruned time.Time
}

func newAlerter(s *Supervisor) *alerter {
	// No keep-alive: alerts are rare, and idle connections would outlive Stop.
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DisableKeepAlives: true}}
	ctx, cancel := context.WithCancel(context.Background())
	return &alerter{s: s, client: client, ctx: ctx, cancel: cancel, last: map[string]time.Time{}}
}

// stop lets webhook deliveries in progress finish while ctx allows, then
// abandons the rest.
func (a *alerter) stop(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		a.deliveries.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		a.s.log.Warn("alert webhook deliveries abandoned at stop")
	}
	a.cancel()
	<-done
}

// reset forgets cached incidents; a new leader reads them from the stream.
func (a *alerter) reset() {
	a.mu.Lock()
	a.last = map[string]time.Time{}
	a.pruned = time.Time{}
	a.mu.Unlock()
}

// raise sends al unless an alert with the same key was sent inside the
// dedupe window. It fills id and time, and reports whether it was sent.
func (a *alerter) raise(ctx context.Context, al *jetfleetpb.Alert) bool {
	s := a.s
	now := s.clk.Now()
	window := s.cfg.Alerts.DedupeWindow
	a.mu.Lock()
	a.pruneLocked(now, window)
	last, known := a.last[al.GetKey()]
	a.mu.Unlock()
	if !known {
		last = a.loadIncident(ctx, al.GetKey())
	}
	a.mu.Lock()
	if t, ok := a.last[al.GetKey()]; ok && t.After(last) {
		last = t
	}
	if !last.IsZero() && now.Sub(last) < window {
		a.last[al.GetKey()] = last
		a.mu.Unlock()
		s.metrics.alerts.Add(ctx, 1, attrs("type", al.GetType(), "severity", al.GetSeverity(), "outcome", "deduplicated"))
		return false
	}
	a.last[al.GetKey()] = now
	a.mu.Unlock()

	al.Id = nuid.Next()
	al.Time = timestampNow(s.clk)
	data, err := protocol.Marshal(al)
	if err != nil {
		s.log.Error("encode alert", telemetry.LogError, err)
		return false
	}
	a.storeIncident(ctx, al.GetKey(), now)
	a.storeAlert(al.GetKey(), data)
	if err := s.nc.Publish(protocol.AlertSubject(al.GetSeverity()), data); err != nil {
		s.log.Warn("alert not published", "key", al.GetKey(), telemetry.LogError, err)
	}
	s.metrics.alerts.Add(ctx, 1, attrs("type", al.GetType(), "severity", al.GetSeverity(), "outcome", "sent"))
	s.log.Warn("alert", "key", al.GetKey(), "severity", al.GetSeverity(), "summary", al.GetSummary())

	names := make([]string, 0, len(s.cfg.Alerts.Webhooks))
	for name := range s.cfg.Alerts.Webhooks {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		hook := s.cfg.Alerts.Webhooks[name]
		if severityRank(al.GetSeverity()) < severityRank(hook.MinSeverity) {
			continue
		}
		a.deliveries.Add(1)
		go func() {
			defer a.deliveries.Done()
			a.deliver(a.ctx, name, hook, al.GetId(), data)
		}()
	}
	return true
}

// pruneLocked forgets, at most once per window, the incidents whose alert
// is older than the window: they deduplicate nothing any more, and keys
// such as agent_dead:<agent> would otherwise pile up.
func (a *alerter) pruneLocked(now time.Time, window time.Duration) {
	if now.Sub(a.pruned) < window {
		return
	}
	a.pruned = now
	for key, at := range a.last {
		if now.Sub(at) >= window {
			delete(a.last, key)
		}
	}
}

func (a *alerter) loadIncident(ctx context.Context, key string) time.Time {
	rctx, cancel := a.s.requestCtx(ctx)
	defer cancel()
	m, err := a.s.store.GetLastMsgForSubject(rctx, incidentSubject(key))
	if err != nil {
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			a.s.log.Debug("alert incident unreadable", "key", key, telemetry.LogError, err)
		}
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, string(m.Data))
	if err != nil {
		return time.Time{}
	}
	return t
}

// storeIncident records when the alert of an incident was sent, and waits
// for the server: a new leader reads it to keep deduplicating.
func (a *alerter) storeIncident(ctx context.Context, key string, at time.Time) {
	rctx, cancel := a.s.requestCtx(ctx)
	defer cancel()
	msg := &nats.Msg{Subject: incidentSubject(key), Data: []byte(at.UTC().Format(time.RFC3339Nano))}
	if _, err := a.s.js.PublishMsg(rctx, msg); err != nil {
		a.s.log.Warn("alert incident not stored; another leader may send this alert again within the dedupe window",
			"key", key, telemetry.LogError, err)
	}
}

// deliver posts an alert to one webhook, retrying failures with doubling
// waits (real time: it races a remote server) until max_attempts.
func (a *alerter) deliver(ctx context.Context, name string, hook WebhookConfig, id string, body []byte) {
	s := a.s
	wait := hook.Backoff
	for attempt := 1; ; attempt++ {
		err := a.post(ctx, hook, id, body)
		if err == nil {
			s.metrics.webhooks.Add(ctx, 1, attrs("webhook", name, "outcome", "delivered"))
			return
		}
		if attempt >= hook.MaxAttempts || ctx.Err() != nil {
			s.metrics.webhooks.Add(ctx, 1, attrs("webhook", name, "outcome", "failed"))
			s.log.Error("alert webhook failed; alert not delivered", "webhook", name, "attempts", attempt, telemetry.LogError, err)
			return
		}
		s.metrics.webhooks.Add(ctx, 1, attrs("webhook", name, "outcome", "retried"))
		s.log.Warn("alert webhook failed; retrying", "webhook", name, "attempt", attempt, "retry_in", wait.String(), telemetry.LogError, err)
		if !sleepCtx(ctx, wait) {
			return
		}
		wait = min(2*wait, time.Minute)
	}
}

func (a *alerter) post(ctx context.Context, hook WebhookConfig, id string, body []byte) error {
	rctx, cancel := context.WithTimeout(ctx, hook.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, hook.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("User-Agent", "jetfleet-supervisor")
	for k, v := range hook.Headers {
		req.Header.Set(k, v)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// A puller keeps one pull request open on one queue's consumer, through
// one long-lived inbox subscription, for exactly as many jobs as it holds
// reserved slots: a job is only ever requested for a slot kept free for it,
// because AckWait starts at delivery. With one request open at a time,
// every delivery belongs to it, so its count of jobs still to come is exact
// whatever order the server fills requests in. Slots freed meanwhile are
// gathered and asked for as soon as the request ends (filled, expired or
// refused). Requests expire after fetch_max_wait, so a stopping agent knows
// when nothing more can arrive.
//
// Nothing here runs on a goroutine of its own: slots are offered by the
// goroutine that frees them, and deliveries arrive on the subscription's.
type puller struct {
	a       *Agent
	q       *queueState
	subject string // the consumer's next-message API subject
	inbox   string // a request replies to <inbox>.<request id>
	expiry  time.Duration
	sub     *nats.Subscription

	mu sync.Mutex
	// open is the request being answered, nil when none is; gathered slots
	// are reserved but not requested yet.
	open     *pullRequest
	nextID   uint64
	gathered int
	// holdUntil pauses requests after the server refused one.
	holdUntil time.Time
	stopping  bool
	drained   chan struct{} // closed once stopping with no request open
}

// pullRequest is the open pull request.
type pullRequest struct {
	id        uint64
	remaining int       // jobs asked for and not delivered yet
	lostAfter time.Time // past this without an answer, the request is lost
}

// refusalPause is how long a puller waits after the server refused a request.
const refusalPause = 250 * time.Millisecond

// lostMargin is how long past its expiry a request may stay unanswered
// before the puller counts it lost (a server restart or leader change).
const lostMargin = 2 * time.Second

func newPuller(a *Agent, q *queueState) (*puller, error) {
	p := &puller{
		a: a, q: q,
		subject: fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", protocol.StreamJobs, protocol.QueueConsumer(q.name)),
		inbox:   a.nc.NewInbox(),
		expiry:  a.cfg.FetchMaxWait,
		drained: make(chan struct{}),
	}
	sub, err := a.nc.Subscribe(p.inbox+".*", p.receive)
	if err != nil {
		return nil, err
	}
	// Deliveries were requested for reserved slots: never drop one.
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	return p, nil
}

// offer gives the puller n reserved slots; it asks for jobs for them now or
// once the open request ends. It reports false when the puller is stopping
// and took nothing.
func (p *puller) offer(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return false
	}
	p.gathered += n
	p.requestLocked()
	return true
}

// requestLocked sends a pull request for the gathered slots when none is open.
func (p *puller) requestLocked() {
	if p.open != nil || p.gathered == 0 || p.stopping || time.Now().Before(p.holdUntil) {
		return
	}
	req, _ := json.Marshal(struct {
		Batch   int   `json:"batch"`
		Expires int64 `json:"expires"`
	}{p.gathered, p.expiry.Nanoseconds()})
	p.nextID++
	if err := p.a.nc.PublishRequest(p.subject, p.inbox+"."+strconv.FormatUint(p.nextID, 10), req); err != nil {
		// Keep the slots gathered; the lost-request check tries again.
		p.a.logger.Warn("pull request failed", telemetry.LogQueue, p.q.name, telemetry.LogError, err)
		return
	}
	p.open = &pullRequest{id: p.nextID, remaining: p.gathered, lostAfter: time.Now().Add(p.expiry + lostMargin)}
	p.gathered = 0
}

// receive handles one message on the inbox: a job, or a status that ends a
// request. Jobs always carry an ack subject as reply; statuses never do.
func (p *puller) receive(m *nats.Msg) {
	if m.Reply != "" {
		p.mu.Lock()
		reserved := p.open != nil
		if reserved {
			p.open.remaining--
			if p.open.remaining == 0 {
				p.open = nil // filled: the server sends no status for it
				p.requestLocked()
				p.checkDrainedLocked()
			}
		} else {
			p.a.logger.Warn("job delivered for a request counted lost; it runs beyond the agent's concurrency", telemetry.LogQueue, p.q.name)
		}
		p.mu.Unlock()
		p.a.startJob(p.q, newDelivery(p.a.nc, m), reserved)
		return
	}
	status := m.Header.Get("Status")
	switch status {
	case "100": // idle heartbeat or flow control
		return
	case "408", "409", "503": // expired; refused or ended; no consumer took it (deleted, or not there yet)
		id, _ := strconv.ParseUint(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], 10, 64)
		p.mu.Lock()
		if status != "408" {
			description := m.Header.Get("Description")
			if status == "503" {
				description = "no responders: the queue's consumer is missing"
			}
			p.a.logger.Warn("pull request refused or ended", telemetry.LogQueue, p.q.name, "description", description)
			p.holdUntil = time.Now().Add(refusalPause) // do not hammer a server that refuses…
			time.AfterFunc(refusalPause, func() {      // …but ask again as soon as the pause is over
				p.mu.Lock()
				defer p.mu.Unlock()
				p.requestLocked()
			})
		}
		var freed int
		if p.open != nil && p.open.id == id {
			freed = p.endLocked() // a status about an older request counted lost changes nothing
		}
		p.mu.Unlock()
		p.a.releaseSlots(freed)
	default:
		p.a.logger.Warn("unexpected pull status", telemetry.LogQueue, p.q.name, "status", status, "description", m.Header.Get("Description"))
	}
}

// endLocked ends the open request and returns how many of its slots are
// free for others: none while running (they are asked for again), all
// while stopping.
func (p *puller) endLocked() (freed int) {
	left := p.open.remaining
	p.open = nil
	if p.stopping {
		p.checkDrainedLocked()
		return left
	}
	p.gathered += left
	p.requestLocked()
	return 0
}

// checkLost ends the open request when it should have been answered by now
// but was not (a server restart or leader change loses requests), and asks
// again; it also sends a request held back after a refusal or failure.
func (p *puller) checkLost() {
	p.mu.Lock()
	var freed int
	if p.open != nil && time.Now().After(p.open.lostAfter) {
		p.a.logger.Warn("pull request went unanswered; asking again", telemetry.LogQueue, p.q.name, "jobs", p.open.remaining)
		freed = p.endLocked()
	}
	p.requestLocked()
	p.mu.Unlock()
	p.a.releaseSlots(freed)
}

// stop ends new requests and returns the reserved slots no request holds;
// drained closes once the open request is answered or expired.
func (p *puller) stop() (returned int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return 0
	}
	p.stopping = true
	returned, p.gathered = p.gathered, 0
	p.checkDrainedLocked()
	return returned
}

func (p *puller) checkDrainedLocked() {
	if p.stopping && p.open == nil {
		select {
		case <-p.drained:
		default:
			close(p.drained)
		}
	}
}

// close removes the inbox subscription and gives up on an open request
// (on a dead connection it is never answered), so nothing waits on drained
// for ever.
func (p *puller) close() {
	_ = p.sub.Unsubscribe()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = true
	p.open = nil
	p.checkDrainedLocked()
}

// checkLostLoop runs checkLost for every puller once per fetch_max_wait.
func (a *Agent) checkLostLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.FetchMaxWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, p := range a.pullers {
				p.checkLost()
			}
		}
	}
}

// delivery is one delivered job message and the acks that answer it (see
// docs/protocol.md §3.2).
type delivery struct {
	nc  *nats.Conn
	msg *nats.Msg
	ack protocol.AckSubject
	err error // when the reply is not an ack subject
}

func newDelivery(nc *nats.Conn, m *nats.Msg) *delivery {
	d := &delivery{nc: nc, msg: m}
	d.ack, d.err = protocol.ParseAckSubject(m.Reply)
	return d
}

func (d *delivery) Subject() string      { return d.msg.Subject }
func (d *delivery) Reply() string        { return d.msg.Reply }
func (d *delivery) Data() []byte         { return d.msg.Data }
func (d *delivery) Headers() nats.Header { return d.msg.Header }

func (d *delivery) Nak() error { return d.respond(protocol.NakBody) }

func (d *delivery) NakWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return d.Nak()
	}
	return d.respond(protocol.NakWithDelayBody(delay))
}

func (d *delivery) InProgress() error { return d.respond(protocol.InProgressBody) }

func (d *delivery) TermWithReason(reason string) error {
	return d.respond(protocol.TermBody + " " + reason)
}

func (d *delivery) respond(body string) error {
	if d.msg.Reply == "" {
		return errors.New("message has no reply subject")
	}
	return d.nc.Publish(d.msg.Reply, []byte(body))
}

package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// A puller asks one queue's consumer for jobs through pull requests on one
// long-lived inbox subscription, only ever for slots reserved for them:
// AckWait starts at delivery, so a job is requested only for a slot kept
// free to start it at once. Freed slots are asked for at once when nothing
// is outstanding, and beside the open requests once at most half the slots
// are still outstanding and a quarter of them are gathered (as nats.go's
// Consume refills, in batches of a half): the server then
// holds a request of the agent's while it works, where asking only once the
// open request is filled would leave the consumer idle for a round trip
// every batch. An idle agent holds one request: the server spreads
// deliveries over requests, not agents, so holding more would draw more
// than the agent's share of a queue's jobs (a kind it passes on included).
//
// The server spreads deliveries over a consumer's open requests in turn, so
// a delivery cannot be told apart by request; the count of jobs asked for
// and not delivered yet, outstanding, is kept for all requests together,
// as nats.go's Consume keeps it: a request that ends before it is filled
// (expired, refused) reports on its own reply subject how many jobs it did
// not deliver (Nats-Pending-Messages), and a filled one reports nothing.
// A request whose expiry has passed by lostMargin can deliver nothing more,
// so any outstanding jobs beyond what the unexpired requests asked for
// belonged to requests that were lost (a server restart or leader change);
// they are asked for again. All requests share one expiry, so they are kept
// in the order they expire: the expired leave from the front, with the
// count of what the rest may still deliver kept as they come and go.
//
// Nothing here runs on a goroutine of its own: slots are offered by the
// goroutine that frees them, and deliveries arrive on the subscription's.
type puller struct {
	a        *Agent
	q        *queueState
	priority string // of the jobs of q this puller asks for
	subject  string // the consumer's next-message API subject
	inbox    string // a request replies to <inbox>.<request id>
	expiry   time.Duration
	// lowWater is the most jobs outstanding at which freed slots are asked
	// for beside the open requests, minBatch the fewest asked for so: a
	// request per job or two would cost the server more than the job.
	lowWater, minBatch int
	sub                *nats.Subscription

	mu sync.Mutex
	// open lists the requests not known to be ended, oldest first; a
	// filled one stays until its expiry passes, one ended by a status
	// stays with batch 0. asked is the sum of their batches: the most they
	// may still deliver. outstanding counts the jobs they will deliver
	// unless lost; gathered slots are reserved and not requested yet.
	open        []pullRequest
	asked       int
	outstanding int
	nextID      uint64
	gathered    int
	// holdUntil pauses requests after the server refused one.
	holdUntil time.Time
	stopping  bool
	drained   chan struct{} // closed once stopping with nothing outstanding

	// busy: the queue has work. Set by a delivery, cleared when a request
	// expires short of jobs; an idle queue keeps one slot (its probe) and
	// gives the rest to the busy ones (Agent.releaseSlots).
	busy atomic.Bool
	// dormant: a high or low priority no job came to for dormantAfter. It
	// holds no probe (so an agent whose queues use no priorities keeps
	// every slot for them); wakeDormant looks at its consumer's pending
	// count every dormantCheck and gives it a probe again when a job waits.
	dormant atomic.Bool
	// idleSince is when the puller last turned idle (guarded by mu).
	idleSince time.Time
}

// dormantAfter is how long a high or low priority stays idle before its
// puller gives up its probe; dormantCheck how often a dormant puller looks
// for waiting jobs.
const (
	dormantAfter = time.Minute
	dormantCheck = 2 * time.Second
)

// pullRequest is a request that may still deliver jobs.
type pullRequest struct {
	id        uint64
	batch     int       // jobs asked for
	lostAfter time.Time // past this the request delivers nothing more
}

// refusalPause is how long a puller waits after the server refused a request.
const refusalPause = 250 * time.Millisecond

// lostMargin is how long past its expiry a request may stay unanswered
// before the puller counts it lost (a server restart or leader change).
const lostMargin = 2 * time.Second

func newPuller(a *Agent, q *queueState, priority string) (*puller, error) {
	p := &puller{
		a: a, q: q, priority: priority,
		subject:  fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.%s", protocol.StreamJobs, protocol.PriorityConsumer(q.name, priority)),
		inbox:    a.nc.NewInbox(),
		expiry:   a.cfg.FetchMaxWait,
		lowWater: a.cfg.slots() / 2,
		minBatch: max(a.cfg.slots()/4, 1),
		drained:  make(chan struct{}),
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
// once the open requests run low. It reports false when the puller is
// stopping and took nothing.
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

// takeProbe gives a puller that holds no slot (none gathered, none
// outstanding) one, to keep a request open on its queue. It reports
// whether it took it.
func (p *puller) takeProbe() bool {
	if p.dormant.Load() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping || p.gathered > 0 || p.outstanding > 0 {
		return false
	}
	p.gathered = 1
	p.requestLocked()
	return true
}

// requestLocked sends a pull request for the gathered slots when nothing
// is outstanding, or when at most lowWater jobs are and minBatch slots are
// gathered.
func (p *puller) requestLocked() {
	if p.gathered == 0 || p.stopping || time.Now().Before(p.holdUntil) {
		return
	}
	if p.outstanding > 0 && (p.outstanding > p.lowWater || p.gathered < p.minBatch) {
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
	p.open = append(p.open, pullRequest{id: p.nextID, batch: p.gathered, lostAfter: time.Now().Add(p.expiry + lostMargin)})
	p.asked += p.gathered
	p.outstanding += p.gathered
	p.gathered = 0
}

// receive handles one message on the inbox: a job, or a status that ends a
// request. Jobs always carry an ack subject as reply; statuses never do.
func (p *puller) receive(m *nats.Msg) {
	if m.Reply != "" {
		p.mu.Lock()
		reserved := p.outstanding > 0
		if reserved {
			if p.outstanding--; p.outstanding == 0 {
				p.open, p.asked = p.open[:0], 0 // every open request is filled: the server sends no status for them
				p.checkDrainedLocked()
			}
			p.requestLocked()
		} else {
			p.a.logger.Warn("job delivered for a request counted lost; no slot is free for it, so it is handed back", telemetry.LogQueue, p.q.name)
		}
		p.idleSince = time.Time{}
		p.mu.Unlock()
		p.dormant.Store(false)
		if !p.busy.Swap(true) || p.a.spare.Load() > 0 {
			p.a.claimSpare() // the queue has work: the spare slots are its
		}
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
		freed := p.endLocked(id, status, m.Header)
		p.mu.Unlock()
		p.a.releaseSlots(freed)
	default:
		p.a.logger.Warn("unexpected pull status", telemetry.LogQueue, p.q.name, "status", status, "description", m.Header.Get("Description"))
	}
}

// endLocked ends the open request id and returns how many slots are free
// for others: none while running (they are asked for again), all while
// stopping. A status about a request no longer open (filled and expired,
// ended, or counted lost) changes nothing.
func (p *puller) endLocked(id uint64, status string, h nats.Header) (freed int) {
	if status == "409" && consumerGone(h.Get("Description")) {
		// No open request of the consumer delivers anything more; the
		// others' statuses, if they come, find nothing open.
		p.open, p.asked = p.open[:0], 0
		return p.returnLocked(p.outstanding)
	}
	i, found := slices.BinarySearchFunc(p.open, id, func(r pullRequest, id uint64) int { return cmp.Compare(r.id, id) })
	if !found || p.open[i].batch == 0 {
		return 0
	}
	req := &p.open[i]
	p.asked -= req.batch
	undelivered := min(p.undelivered(req.batch, status, h), p.outstanding)
	req.batch = 0
	if status == "408" && undelivered > 0 && !p.stopping {
		// Expired short of jobs: the queue is idle. Its slots go back to
		// be shared (Agent.releaseSlots gives it its probe again, unless
		// slots are scarce and another puller has none: probes rotate). A
		// priority idle for dormantAfter keeps none.
		now := time.Now()
		if p.busy.Swap(false) || p.idleSince.IsZero() {
			p.idleSince = now
		}
		if p.priority != protocol.PriorityDefault && now.Sub(p.idleSince) >= dormantAfter {
			p.dormant.Store(true)
		}
		p.outstanding -= undelivered
		return undelivered
	}
	return p.returnLocked(undelivered)
}

// consumerGone reports whether a 409 says the consumer is gone from under
// every open request: deleted, or its leader changed (these carry no count
// of what was not delivered). nats.go reads the same descriptions.
func consumerGone(description string) bool {
	return description == "Consumer Deleted" || description == "Leadership Change"
}

// undelivered is how many jobs of a request for batch its ending status
// says will not come. An expired request and most ended ones report it; one
// refused before it reached a consumer (503) delivered none. Without a
// report (a refusal, or a status this code does not know) the fewest the
// count of all requests allows are taken — exact when the request is the
// only one open — so the agent never holds more jobs than free slots; the
// lost-request check frees the rest once the request's expiry passes. The
// request's own batch is already out of p.asked.
func (p *puller) undelivered(batch int, status string, h nats.Header) int {
	if pending := h.Get("Nats-Pending-Messages"); pending != "" {
		if n, err := strconv.Atoi(pending); err == nil {
			return min(max(n, 0), batch)
		}
	}
	if status == "503" {
		return batch
	}
	return min(max(p.outstanding-p.asked, 0), batch)
}

// returnLocked takes n jobs that will not be delivered off outstanding and
// returns how many slots are free for others (see endLocked).
func (p *puller) returnLocked(n int) (freed int) {
	p.outstanding -= n
	if p.stopping {
		p.checkDrainedLocked()
		return n
	}
	p.gathered += n
	p.requestLocked()
	return 0
}

// checkLost forgets requests whose expiry passed by lostMargin: by then a
// request was filled or said it ended, unless it was lost; jobs outstanding
// beyond what the requests still open asked for were the lost requests'
// and are asked for again. It also sends a request held back after a
// refusal or failure.
func (p *puller) checkLost() {
	p.mu.Lock()
	now := time.Now()
	expired := 0
	for expired < len(p.open) && now.After(p.open[expired].lostAfter) {
		p.asked -= p.open[expired].batch
		expired++
	}
	p.open = p.open[expired:]
	var freed int
	if lost := p.outstanding - p.asked; lost > 0 {
		p.a.logger.Warn("pull requests went unanswered; asking again", telemetry.LogQueue, p.q.name, "jobs", lost)
		freed = p.returnLocked(lost)
	}
	p.requestLocked()
	p.mu.Unlock()
	p.a.releaseSlots(freed)
}

// stop ends new requests and returns the reserved slots no request holds;
// drained closes once the open requests are filled, ended or expired.
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
	if p.stopping && p.outstanding == 0 {
		select {
		case <-p.drained:
		default:
			close(p.drained)
		}
	}
}

// close removes the inbox subscription and gives up on open requests (on a
// dead connection they are never answered), so nothing waits on drained
// for ever.
func (p *puller) close() {
	_ = p.sub.Unsubscribe()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = true
	p.open, p.asked, p.outstanding = nil, 0, 0
	p.checkDrainedLocked()
}

// checkLostLoop runs checkLost for every puller once per fetch_max_wait,
// and wakeDormant once per dormantCheck.
func (a *Agent) checkLostLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.FetchMaxWait)
	defer t.Stop()
	lastWake := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, p := range a.pullers {
				p.checkLost()
			}
			if now.Sub(lastWake) >= dormantCheck {
				lastWake = now
				a.wakeDormant(ctx)
			}
		}
	}
}

// wakeDormant gives the dormant pullers whose consumer has jobs waiting a
// probe again: from the spare slots, else the next slot freed.
func (a *Agent) wakeDormant(ctx context.Context) {
	for _, p := range a.pullers {
		if !p.dormant.Load() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, asyncTimeout)
		cons, err := a.js.Consumer(rctx, protocol.StreamJobs, protocol.PriorityConsumer(p.q.name, p.priority))
		cancel()
		if err != nil || cons.CachedInfo().NumPending == 0 {
			continue
		}
		p.dormant.Store(false)
		p.mu.Lock()
		p.idleSince = time.Time{}
		p.mu.Unlock()
		if a.spare.Add(-1) >= 0 {
			a.releaseSlots(1) // its probe, unless a puller with none comes first
		} else {
			a.spare.Add(1) // none spare: it takes the next slot freed
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

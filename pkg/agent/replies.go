package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// answerWaiter is told the server's answer to a message sent through
// replies: the answer's body, or an error when there was none in time or
// the server said no one could take it.
type answerWaiter interface {
	answered(body []byte, err error)
}

// replies sends the messages an agent needs the server to answer but does
// not wait on — a job's events (the stream's publish ack) and its acks (the
// ack's confirmation) — and routes every answer through one long-lived
// inbox subscription, in the order they arrive. Nothing is allocated per
// message beyond its reply subject and a map entry: no subscription,
// channel, timer or context, which is what a request or a nats.go
// asynchronous publish costs each (a sizeable share of an agent's CPU per
// no-op job; see docs/performance.md).
type replies struct {
	nc      *nats.Conn
	prefix  string // answers arrive on <prefix><id>
	timeout time.Duration
	sub     *nats.Subscription

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]waitingAnswer
}

type waitingAnswer struct {
	waiter   answerWaiter
	deadline time.Time
}

// errNoAnswer is reported when no answer arrived within the timeout (a lost
// message, a stream leader change).
var errNoAnswer = errors.New("no answer from the server in time")

// errDisconnected: the connection dropped before the answer came.
var errDisconnected = errors.New("disconnected before the server answered")

// errNoResponders is reported when the server said no one takes the subject:
// no stream stores it (an event), its consumer is gone (an ack), or
// JetStream is unavailable.
var errNoResponders = errors.New("no responders: nothing on the server takes the subject (no stream, no consumer, or JetStream unavailable)")

func newReplies(nc *nats.Conn, timeout time.Duration) (*replies, error) {
	r := &replies{nc: nc, prefix: nc.NewInbox() + ".", timeout: timeout, waiting: map[uint64]waitingAnswer{}}
	sub, err := nc.Subscribe(r.prefix+"*", r.receive)
	if err != nil {
		return nil, err
	}
	// Every answer is awaited: never drop one.
	_ = sub.SetPendingLimits(-1, -1)
	r.sub = sub
	return r, nil
}

// send publishes msg with a reply subject of its own; w is told the answer.
// On an error w is told nothing.
func (r *replies) send(msg *nats.Msg, w answerWaiter) error {
	r.mu.Lock()
	r.nextID++
	id := r.nextID
	r.waiting[id] = waitingAnswer{waiter: w, deadline: time.Now().Add(r.timeout)}
	r.mu.Unlock()
	var buf [64]byte
	msg.Reply = string(strconv.AppendUint(append(buf[:0], r.prefix...), id, 10))
	if err := r.nc.PublishMsg(msg); err != nil {
		if r.take(id) == nil {
			// Answered already: the connection dropped meanwhile and
			// abandon (or expire) told w. Telling it again would settle
			// its event twice.
			return nil
		}
		return err
	}
	return nil
}

// take removes and returns the waiter of id, nil when it was answered or
// timed out already.
func (r *replies) take(id uint64) answerWaiter {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.waiting[id]
	if !ok {
		return nil
	}
	delete(r.waiting, id)
	return w.waiter
}

func (r *replies) receive(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Subject[len(r.prefix):], 10, 64)
	if err != nil {
		return
	}
	w := r.take(id)
	if w == nil {
		return // timed out already; its waiter was told
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		w.answered(nil, errNoResponders)
		return
	}
	w.answered(m.Data, nil)
}

// expireLoop tells the waiters of messages unanswered past their deadline,
// until ctx ends. It looks often, so an answer is given up on close to its
// deadline; the waiting set is only as large as the jobs being answered.
func (r *replies) expireLoop(ctx context.Context) { expireEvery(ctx, r.timeout, r.expire) }

// expireEvery calls expire a hundred times per timeout (at most every 10ms)
// until ctx ends, so what waits for an answer is given up on close to its
// deadline.
func expireEvery(ctx context.Context, timeout time.Duration, expire func(now time.Time)) {
	t := time.NewTicker(max(timeout/100, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			expire(now)
		}
	}
}

func (r *replies) expire(now time.Time) {
	var expired []answerWaiter
	r.mu.Lock()
	for id, w := range r.waiting {
		if now.After(w.deadline) {
			delete(r.waiting, id)
			expired = append(expired, w.waiter)
		}
	}
	r.mu.Unlock()
	for _, w := range expired {
		w.answered(nil, errNoAnswer)
	}
}

// abandon gives up on every awaited answer: the connection dropped, so
// none will come.
func (r *replies) abandon() {
	r.mu.Lock()
	abandoned := make([]answerWaiter, 0, len(r.waiting))
	for id, w := range r.waiting {
		delete(r.waiting, id)
		abandoned = append(abandoned, w.waiter)
	}
	r.mu.Unlock()
	for _, w := range abandoned {
		w.answered(nil, errDisconnected)
	}
}

// close ends the subscription and returns how many answers were still
// awaited: their waiters are never told.
func (r *replies) close() (unanswered int) {
	_ = r.sub.Unsubscribe()
	r.mu.Lock()
	defer r.mu.Unlock()
	unanswered = len(r.waiting)
	clear(r.waiting)
	return unanswered
}

// pubAckError reads a JetStream publish ack: nil when the message was
// stored, else the server's error. The ack of a stored message,
// {"stream":…,"seq":…}, is recognised without a JSON decoder: it answers
// nearly every event, and a decoder costs more than the rest of its handling.
func pubAckError(body []byte) error {
	if bytes.HasPrefix(body, []byte(`{"stream":`)) && bytes.Contains(body, []byte(`"seq":`)) &&
		!bytes.Contains(body, []byte(`"error":`)) {
		return nil
	}
	var ack struct {
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
		Error  *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	switch err := json.Unmarshal(body, &ack); {
	case err != nil:
		return fmt.Errorf("unreadable publish ack %q: %w", body, err)
	case ack.Error != nil:
		return fmt.Errorf("stream refused the message: %s (code %d, error code %d)", ack.Error.Description, ack.Error.Code, ack.Error.ErrCode)
	case ack.Stream == "" || ack.Seq == 0:
		return fmt.Errorf("unexpected publish ack %q", body)
	}
	return nil
}

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// eventBatches publishes an agent's job events as JetStream fast batches
// (server 2.14+, a stream with allow_batched): the server confirms a batch
// every few hundred events and once at its end, instead of answering each
// event, which saves about a tenth of the CPU a no-op job costs the agent's
// process and the server (docs/performance.md).
//
// A batch collects the events published within batchWindow (or
// batchMaxEvents of them) and is then ended by a commit marker. It runs in
// "gap: fail" mode, so every answer is exact: a flow ack with sequence N
// says events 1..N of the batch are stored, and the batch's final publish
// ack with count C says events 1..C are stored and none after C will be
// (after an error or a gap the server ends the batch). An event of a
// batch that is not confirmed — past C, refused, or without an answer
// within asyncTimeout — is sent again on its own, as the recorder sends an
// event that was not stored (superseded events are not).
//
// When the stream also takes atomic batches (allow_atomic, server 2.12+),
// a batch is an atomic one instead: its events carry Nats-Batch-Id and
// Nats-Batch-Sequence, only the end-of-batch marker is answered, and the
// server stores all of the batch or none of it. With every write synced,
// one server then syncs once per batch instead of once per event
// (BenchmarkSyncedBatches). An event sent again whose Nats-Msg-Id was stored
// fails its whole atomic batch: its events are then sent one by one, where
// the duplicate is dropped alone.
type eventBatches struct {
	nc            *nats.Conn
	logger        *slog.Logger
	atomic        bool   // atomic batches instead of fast ones
	inbox         string // answers arrive on <inbox>.<batch id>.<flow>.fail.<seq>.<op>.$FI (atomic: <inbox>.<batch id>)
	commitSubject string
	window        time.Duration
	sub           *nats.Subscription

	mu      sync.Mutex
	current *eventBatch            // taking events; nil until the next event
	open    map[string]*eventBatch // sent and not settled, by id
	// pausedUntil stops batching for a while after the server refused a
	// batch (another server version, a changed stream, too many batches).
	pausedUntil time.Time
}

// eventBatch is one fast batch: events[i] has batch sequence i+1.
type eventBatch struct {
	id        string
	reply     string // <inbox>.<id>.<flow>.fail.
	events    []*pendingEvent
	confirmed int // events[:confirmed] are stored
	committed bool
	deadline  time.Time // once committed: answers past it are given up on
}

const (
	// batchWindow is how long a batch takes events before it is committed:
	// the longest an event of a quiet agent waits for its confirmation.
	batchWindow = 20 * time.Millisecond
	// batchMaxEvents ends a batch early under load.
	batchMaxEvents = 2000
	// batchFlow is the most events the server may store between two flow
	// acks of a batch (it sends them more often while several batches run).
	batchFlow = 500
	// batchPause is how long events go out one by one after a refusal.
	batchPause = 5 * time.Second

	// atomicBatchMaxEvents stays below the server's default limit of an
	// atomic batch (1,000 messages, max_batch_size).
	atomicBatchMaxEvents = 500

	// The headers of an atomic batch's messages.
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
	// errCodeAtomicDuplicate: an atomic batch held a message whose
	// Nats-Msg-Id was stored before (an event sent again), so none of it was.
	errCodeAtomicDuplicate = 10201

	// The operations of a fast-batch message (the server's FastBatchOp*).
	batchOpStart     = "0"
	batchOpAppend    = "1"
	batchOpCommitEOB = "3" // ends the batch without a message of its own
	batchReplySuffix = ".$FI"
)

// errBatchNotStored is what an event of a batch that ended before it was
// stored is resent with.
var (
	errBatchNotStored  = errors.New("event batch ended before the event was stored")
	errBatchUnanswered = fmt.Errorf("%w: no answer from the server in time", errBatchNotStored)
)

func newEventBatches(nc *nats.Conn, commitSubject string, atomic bool, logger *slog.Logger) (*eventBatches, error) {
	b := &eventBatches{nc: nc, logger: logger, atomic: atomic, inbox: nc.NewInbox(), commitSubject: commitSubject,
		window: batchWindow, open: map[string]*eventBatch{}}
	sub, err := nc.Subscribe(b.inbox+".>", b.receive)
	if err != nil {
		return nil, err
	}
	// Every answer is awaited: never drop one.
	_ = sub.SetPendingLimits(-1, -1)
	b.sub = sub
	return b, nil
}

// send publishes e in the current batch and reports true, or reports false
// when batching is paused or the publish failed: the caller sends e on its
// own.
func (b *eventBatches) send(e *pendingEvent) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Now().Before(b.pausedUntil) { // the zero time is long past
		return false
	}
	batch := b.current
	if batch == nil {
		id := nuid.Next()
		batch = &eventBatch{id: id, reply: b.inbox + "." + id + "." + strconv.Itoa(batchFlow) + ".fail."}
		if b.atomic {
			batch.reply = b.inbox + "." + id // only the commit is answered
		}
		b.current = batch
		b.open[id] = batch
		time.AfterFunc(b.window, func() { b.commit(batch) })
	}
	seq := len(batch.events) + 1
	// Sequence and publish under one lock: the server takes a batch's
	// messages in order, a gap ends it.
	var err error
	if b.atomic {
		err = b.nc.PublishMsg(atomicBatchMsg(e.msg, batch.id, seq))
	} else {
		op := batchOpAppend
		if seq == 1 {
			op = batchOpStart
		}
		e.msg.Reply = batch.reply + strconv.Itoa(seq) + "." + op + batchReplySuffix
		if err = b.nc.PublishMsg(e.msg); err != nil {
			e.msg.Reply = ""
		}
	}
	if err != nil {
		if seq == 1 {
			b.current = nil
			delete(b.open, batch.id)
		}
		return false
	}
	batch.events = append(batch.events, e)
	if len(batch.events) >= b.maxEvents() {
		b.commitLocked(batch)
	}
	return true
}

// maxEvents is the most events one batch takes.
func (b *eventBatches) maxEvents() int {
	if b.atomic {
		return atomicBatchMaxEvents
	}
	return batchMaxEvents
}

// atomicBatchMsg is the message of the seq-th event of atomic batch id: the
// event's own message (left as it is, to be sent alone if the batch fails)
// with the batch's headers.
func atomicBatchMsg(event *nats.Msg, id string, seq int) *nats.Msg {
	h := make(nats.Header, len(event.Header)+2)
	for k, v := range event.Header {
		h[k] = v
	}
	h[headerBatchID] = []string{id}
	h[headerBatchSeq] = []string{strconv.Itoa(seq)}
	return &nats.Msg{Subject: event.Subject, Data: event.Data, Header: h}
}

// commit ends batch if it still takes events.
func (b *eventBatches) commit(batch *eventBatch) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.commitLocked(batch)
}

// commitNow ends the current batch, so its events are confirmed without
// waiting for the window (flush, close).
func (b *eventBatches) commitNow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current != nil {
		b.commitLocked(b.current)
	}
}

func (b *eventBatches) commitLocked(batch *eventBatch) {
	if batch.committed {
		return
	}
	batch.committed = true
	batch.deadline = time.Now().Add(asyncTimeout)
	if b.current == batch {
		b.current = nil
	}
	if len(batch.events) == 0 {
		return // its first event was never sent: the server knows no such batch
	}
	msg := &nats.Msg{Subject: b.commitSubject,
		Reply: batch.reply + strconv.Itoa(len(batch.events)+1) + "." + batchOpCommitEOB + batchReplySuffix}
	if b.atomic {
		// An end-of-batch marker: commits the events before it, is not stored.
		msg = &nats.Msg{Subject: b.commitSubject, Reply: batch.reply, Header: nats.Header{
			headerBatchID: {batch.id}, headerBatchSeq: {strconv.Itoa(len(batch.events) + 1)}, headerBatchCommit: {"eob"}}}
	}
	if err := b.nc.PublishMsg(msg); err != nil {
		// No answer will come: the expiry sends the events on their own.
		b.logger.Warn("event batch commit not sent", telemetry.LogError, err)
	}
}

// batchAnswer is any answer the server sends about a fast batch: a flow
// ack ({"type":"ack","seq":N}), a gap or error report ("gap", "err"), or
// the batch's publish ack ({"stream":…,"batch":…,"count":C} or
// {"error":…}).
type batchAnswer struct {
	Type  string `json:"type"`
	Seq   uint64 `json:"seq"`
	Batch string `json:"batch"`
	Count int    `json:"count"`
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

func (b *eventBatches) receive(m *nats.Msg) {
	rest := strings.TrimPrefix(m.Subject, b.inbox+".")
	id, _, _ := strings.Cut(rest, ".")
	var answer batchAnswer
	var refusal error
	switch {
	case len(m.Data) == 0 && m.Header.Get("Status") == "503":
		refusal = errNoResponders
	case json.Unmarshal(m.Data, &answer) != nil:
		refusal = fmt.Errorf("undecodable answer to an event batch: %q", m.Data)
	case answer.Error != nil:
		refusal = fmt.Errorf("%s (code %d, error code %d)", answer.Error.Description, answer.Error.Code, answer.Error.ErrCode)
	}

	b.mu.Lock()
	batch := b.open[id]
	if batch == nil {
		b.mu.Unlock()
		return // settled already: answers to events sent after the batch ended
	}
	var stored, lost []*pendingEvent
	var report bool
	duplicate := answer.Error != nil && answer.Error.ErrCode == errCodeAtomicDuplicate
	switch {
	case refusal != nil:
		if !duplicate { // a duplicate is one event's, not the batches'
			b.pausedUntil = time.Now().Add(batchPause)
		}
		lost = b.endLocked(batch, batch.confirmed)
	case answer.Type == "ack":
		stored = batch.confirmLocked(int(min(answer.Seq, uint64(len(batch.events)))))
	case answer.Type == "gap" || answer.Type == "err":
		// The batch's publish ack follows and says what was stored.
		report = true
	case answer.Batch != "":
		count := min(max(answer.Count, 0), len(batch.events))
		stored = batch.confirmLocked(count)
		lost = b.endLocked(batch, count)
	}
	b.mu.Unlock()

	switch {
	case report:
		b.logger.Warn("event batch reports a problem", "batch", id, "answer", string(m.Data))
	case duplicate:
		b.logger.Debug("event batch held an event stored before; its events are sent one by one", "batch", id, "events", len(lost))
	case refusal != nil:
		b.logger.Warn("event batch refused; its events are sent one by one, and so are all events for a while",
			"batch", id, "events", len(lost), "pause", batchPause, telemetry.LogError, refusal)
	case len(lost) > 0:
		b.logger.Warn("event batch ended before all its events were stored (a gap or an error); the rest are sent one by one",
			"batch", id, "events", len(lost))
	}
	for _, e := range stored {
		e.finish(true)
	}
	for _, e := range lost {
		e.answered(nil, errBatchNotStored)
	}
}

// confirmLocked marks events[:n] stored and returns those not marked before.
func (batch *eventBatch) confirmLocked(n int) []*pendingEvent {
	if n <= batch.confirmed {
		return nil
	}
	stored := batch.events[batch.confirmed:n]
	batch.confirmed = n
	return stored
}

// endLocked forgets batch and returns its events past the first n, which
// were not stored.
func (b *eventBatches) endLocked(batch *eventBatch, n int) []*pendingEvent {
	delete(b.open, batch.id)
	if b.current == batch {
		b.current = nil
	}
	batch.committed = true
	lost := batch.events[max(n, batch.confirmed):]
	batch.confirmed = len(batch.events)
	return lost
}

// expireLoop gives up on batches unanswered past their deadline (a lost
// answer, a stream leader change): their unconfirmed events are sent again
// on their own.
func (b *eventBatches) expireLoop(ctx context.Context) { expireEvery(ctx, asyncTimeout, b.expire) }

func (b *eventBatches) expire(now time.Time) {
	var lost []*pendingEvent
	b.mu.Lock()
	for _, batch := range b.open {
		if batch.committed && now.After(batch.deadline) {
			lost = append(lost, b.endLocked(batch, batch.confirmed)...)
		}
	}
	b.mu.Unlock()
	if len(lost) > 0 {
		b.logger.Warn("event batch unanswered; its events are sent one by one", "events", len(lost))
	}
	for _, e := range lost {
		e.answered(nil, errBatchUnanswered)
	}
}

// abandon ends every open batch, committed or not: the connection dropped,
// so no answer will come. Their unconfirmed events are sent again on their
// own (once the connection is back).
func (b *eventBatches) abandon() {
	var lost []*pendingEvent
	b.mu.Lock()
	for _, batch := range b.open {
		batch.committed = true // no commit goes out for it later
		if b.current == batch {
			b.current = nil
		}
		lost = append(lost, b.endLocked(batch, batch.confirmed)...)
	}
	b.mu.Unlock()
	for _, e := range lost {
		e.answered(nil, errDisconnected)
	}
}

// close ends the answers' subscription.
func (b *eventBatches) close() { _ = b.sub.Unsubscribe() }

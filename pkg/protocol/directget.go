package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// StoredMsg is a message read from a stream by a direct get.
type StoredMsg struct {
	Subject  string
	Sequence uint64
	Time     time.Time
	Header   nats.Header
	Data     []byte
}

// DirectGetRequest is a batched direct get (docs/protocol.md §1.2; server
// 2.11+): the first Batch messages at or after Seq (or StartTime) whose
// subject matches NextBySubject, or the last message of each subject
// matching MultiLast (at or below UpToSeq when set).
type DirectGetRequest struct {
	Seq           uint64     `json:"seq,omitempty"`
	StartTime     *time.Time `json:"start_time,omitempty"`
	NextBySubject string     `json:"next_by_subj,omitempty"`
	MultiLast     []string   `json:"multi_last,omitempty"`
	UpToSeq       uint64     `json:"up_to_seq,omitempty"`
	Batch         int        `json:"batch"`
}

// DirectGetBatch runs req on stream and returns what it read, in stream
// order; none is not an error. Each answer comes as its own message on one
// inbox, the last one a status 204 (end of batch).
func DirectGetBatch(ctx context.Context, nc *nats.Conn, stream string, req DirectGetRequest) ([]StoredMsg, error) {
	if req.Batch <= 0 {
		req.Batch = 1
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return nil, err
	}
	var out []StoredMsg
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return out, fmt.Errorf("direct get on %s: %w", stream, err)
		}
		if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
			switch status {
			case "204", "404": // end of batch; nothing (more) matches
				return out, nil
			case "503":
				return out, fmt.Errorf("direct get on %s: %w", stream, nats.ErrNoResponders)
			default:
				return out, fmt.Errorf("direct get on %s: status %s %s", stream, status, m.Header.Get("Description"))
			}
		}
		seq, _ := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
		at, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
		out = append(out, StoredMsg{Subject: m.Header.Get("Nats-Subject"), Sequence: seq, Time: at, Header: m.Header, Data: m.Data})
	}
}

// FirstSeqAt returns the sequence of the first message of stream stored at
// or after t (0 when none is).
func FirstSeqAt(ctx context.Context, nc *nats.Conn, stream string, t time.Time) (uint64, error) {
	msgs, err := DirectGetBatch(ctx, nc, stream, DirectGetRequest{StartTime: &t, Batch: 1})
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	return msgs[0].Sequence, nil
}

// BackwardScan reads the newest messages matching Filter, newest first, in
// chunks of growing size walked from the end of the stream towards its
// start, since direct gets only read forwards.
type BackwardScan struct {
	Stream, Filter string
	// First and Last bound the sequences to read (the stream's, or a time
	// range's).
	First, Last uint64
	// Want is how many messages to return; MaxScan bounds the sequences
	// walked (0: no bound).
	Want    int
	MaxScan uint64
	// Keep, when set, drops messages it returns false for (they do not
	// count towards Want).
	Keep func(StoredMsg) bool
}

// Run returns up to Want messages, newest first, and next: read on with
// Last = next-1 (0 when the walk reached First). scanned counts the
// sequences walked.
func (b BackwardScan) Run(ctx context.Context, nc *nats.Conn) (out []StoredMsg, next uint64, scanned uint64, err error) {
	if b.Want <= 0 {
		b.Want = 50
	}
	if b.First == 0 {
		b.First = 1
	}
	end := b.Last
	chunk := uint64(max(64, 4*b.Want))
	for end >= b.First && end > 0 {
		if len(out) >= b.Want || (b.MaxScan > 0 && scanned >= b.MaxScan) {
			return out, end + 1, scanned, nil
		}
		start := b.First
		if end >= b.First+chunk {
			start = end - chunk + 1
		}
		var got []StoredMsg
		for seq := start; seq <= end; {
			batch, err := DirectGetBatch(ctx, nc, b.Stream, DirectGetRequest{Seq: seq, NextBySubject: b.Filter, Batch: 1000})
			if err != nil {
				return out, 0, scanned, err
			}
			done := len(batch) == 0
			for _, m := range batch {
				if m.Sequence > end {
					done = true
					break
				}
				if b.Keep == nil || b.Keep(m) {
					got = append(got, m)
				}
				seq = m.Sequence + 1
			}
			if done || len(batch) < 1000 {
				break
			}
		}
		for i := len(got) - 1; i >= 0; i-- {
			out = append(out, got[i])
			if len(out) == b.Want {
				return out, got[i].Sequence, scanned + (end - start + 1), nil
			}
		}
		scanned += end - start + 1
		if start == b.First {
			break
		}
		end = start - 1
		chunk *= 2
	}
	return out, 0, scanned, nil
}

// DirectGetLast reads the last message on subject (wildcards allowed) of
// stream; nil when none matches.
func DirectGetLast(ctx context.Context, nc *nats.Conn, stream, subject string) (*StoredMsg, error) {
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream+"."+subject, nil)
	if err != nil {
		return nil, fmt.Errorf("direct get on %s: %w", stream, err)
	}
	if status := m.Header.Get("Status"); status != "" && len(m.Data) == 0 {
		if status == "404" {
			return nil, nil
		}
		return nil, fmt.Errorf("direct get on %s: status %s %s", stream, status, m.Header.Get("Description"))
	}
	seq, _ := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
	at, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
	return &StoredMsg{Subject: m.Header.Get("Nats-Subject"), Sequence: seq, Time: at, Header: m.Header, Data: m.Data}, nil
}

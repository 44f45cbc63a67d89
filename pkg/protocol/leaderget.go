package protocol

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaderGetLast reads the last message on subject from stream's leader
// ($JS.API.STREAM.MSG.GET, docs/protocol.md §1.2); jetstream.ErrMsgNotFound
// when there is none.
//
// A direct get may be answered by any replica, and a replica that is behind
// answers from what it has: a node back from a partition serves direct gets
// at once, with none of what was stored while it was away. Where "not
// found" decides what happens next — whether an earlier delivery of a job
// already succeeded — only the leader's answer will do. A stream electing
// its leader answers nothing: the caller reads again.
func LeaderGetLast(ctx context.Context, nc *nats.Conn, stream, subject string) (StoredMsg, error) {
	body, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return StoredMsg{}, err
	}
	reply, err := nc.RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return StoredMsg{}, fmt.Errorf("message get on %s: %w", stream, err)
	}
	var resp struct {
		Message *struct {
			Subject  string `json:"subject"`
			Sequence uint64 `json:"seq"`
			Header   []byte `json:"hdrs"`
			Data     []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return StoredMsg{}, fmt.Errorf("message get on %s: undecodable answer: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return StoredMsg{}, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return StoredMsg{}, fmt.Errorf("message get on %s: %s (%d)", stream, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return StoredMsg{}, fmt.Errorf("message get on %s: an answer without a message", stream)
	}
	m := StoredMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data}
	if len(resp.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return StoredMsg{}, fmt.Errorf("message get on %s: headers: %w", stream, err)
		}
	}
	return m, nil
}

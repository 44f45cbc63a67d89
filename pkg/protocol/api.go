package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// The services' NATS APIs (scheduler, supervisor) are NATS micro services:
// a request and its reply are JSON; an error reply carries the
// micro.ErrorCodeHeader status below and an Error document as its body.

// RespondError answers req with err as an Error document. An error that is
// not a *Error is answered as CodeInternal.
func RespondError(req micro.Request, err error) {
	doc := ToDoc(err)
	body, _ := Marshal(doc)
	_ = req.Error(HTTPStatus(doc.GetCode()), doc.GetMessage(), body)
}

// HTTPStatus is the HTTP-style status of an error code, as the
// micro.ErrorCodeHeader of an error reply.
func HTTPStatus(code string) string {
	switch code {
	case CodeInvalidArgument:
		return "400"
	case CodeNotFound:
		return "404"
	case CodeAlreadyExists, CodeConflict:
		return "409"
	case CodeUnavailable:
		return "503"
	}
	return "500"
}

// CallAPI sends req as JSON to subject of the service named service and
// decodes the reply into res (unless res is nil). An error reply comes back
// as a *Error; no responder is CodeUnavailable.
func CallAPI(ctx context.Context, nc *nats.Conn, service, subject string, req, res any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return Errorf(CodeUnavailable, "no %s answers on %s", service, subject)
		}
		return fmt.Errorf("%s %s: %w", service, subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		var doc jetfleetpb.Error
		if Unmarshal(msg.Data, &doc) != nil || doc.GetCode() == "" {
			return Errorf(CodeInternal, "%s (status %s)", msg.Header.Get(micro.ErrorHeader), code)
		}
		return FromDoc(&doc)
	}
	if res == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, res); err != nil {
		return fmt.Errorf("%s %s: decode reply: %w", service, subject, err)
	}
	return nil
}

package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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

// The request subjects of the services' APIs. Every endpoint of the
// scheduler (ScheduleService) and of the supervisor (SupervisorService)
// answers on its own subject; pkg/jetfleet holds the request and reply
// types and a client, docs/scheduling.md and docs/supervision.md their
// fields.
const (
	SchedulerService  = "jetfleet-scheduler"
	SupervisorService = "jetfleet-supervisor"

	APIScheduleAdd      = "jetfleet.api.scheduler.add"
	APIScheduleUpdate   = "jetfleet.api.scheduler.update"
	APIScheduleGet      = "jetfleet.api.scheduler.get"
	APIScheduleList     = "jetfleet.api.scheduler.ls"
	APIScheduleRemove   = "jetfleet.api.scheduler.rm"
	APISchedulePause    = "jetfleet.api.scheduler.pause"
	APIScheduleResume   = "jetfleet.api.scheduler.resume"
	APIScheduleTrigger  = "jetfleet.api.scheduler.trigger"
	APISchedulePreview  = "jetfleet.api.scheduler.preview"
	APIScheduleBackfill = "jetfleet.api.scheduler.backfill"

	APIDLQList   = "jetfleet.api.dlq.ls"
	APIDLQGet    = "jetfleet.api.dlq.get"
	APIDLQReplay = "jetfleet.api.dlq.replay"
	APIDLQPurge  = "jetfleet.api.dlq.purge"

	APIAgents      = "jetfleet.api.supervisor.agents"
	APIRunningJobs = "jetfleet.api.supervisor.jobs"
	APIJobDetail   = "jetfleet.api.supervisor.job"
	APIHistory     = "jetfleet.api.supervisor.history"
	APIStatus      = "jetfleet.api.supervisor.status"
	// APIJobList lists jobs by state (queued, delayed, running, failed,
	// succeeded, dead); APITrends returns a kind's or schedule's trend
	// buckets and verdict, APITrendList every series' verdict.
	APIJobList   = "jetfleet.api.supervisor.jobs.ls"
	APITrends    = "jetfleet.api.supervisor.trends"
	APITrendList = "jetfleet.api.supervisor.trends.ls"

	APIJobCancel = "jetfleet.api.jobs.cancel"

	// Workflows (docs/workflows.md): definitions (add, get, ls, rm) and
	// runs (run, runs, run, retry-failed, cancel), served by the supervisor.
	APIWorkflowAdd         = "jetfleet.api.workflows.add"
	APIWorkflowGet         = "jetfleet.api.workflows.get"
	APIWorkflowList        = "jetfleet.api.workflows.ls"
	APIWorkflowRemove      = "jetfleet.api.workflows.rm"
	APIWorkflowRun         = "jetfleet.api.workflows.run"
	APIWorkflowRuns        = "jetfleet.api.workflows.runs"
	APIWorkflowRunGet      = "jetfleet.api.workflows.runs.get"
	APIWorkflowRetryFailed = "jetfleet.api.workflows.retry-failed"
	APIWorkflowCancel      = "jetfleet.api.workflows.cancel"

	APIQueueList   = "jetfleet.api.queues.ls"
	APIQueueAdd    = "jetfleet.api.queues.add"
	APIQueueRemove = "jetfleet.api.queues.rm"
)

// APIHandlerFunc serves one API endpoint: the request body in, the reply
// (encoded as JSON) or an error out.
type APIHandlerFunc func(ctx context.Context, data []byte) (any, error)

// Forwarded is the result of an endpoint that passed the request on to
// another replica: its reply, error or not, is sent back unchanged.
type Forwarded struct{ Reply *nats.Msg }

func (f *Forwarded) Error() string { return "forwarded" }

// ServeAPI adds endpoints (request subject → handler) to svc. Each request
// runs under a context from base, bounded by timeout; a reply is the
// handler's result as JSON, an error the Error document of AsAPIError.
func ServeAPI(svc micro.Service, base func() context.Context, timeout time.Duration, endpoints map[string]APIHandlerFunc) error {
	for subject, h := range endpoints {
		name := strings.ReplaceAll(strings.TrimPrefix(subject, "jetfleet.api."), ".", "-")
		err := svc.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
			ctx, cancel := context.WithTimeout(base(), timeout)
			defer cancel()
			res, err := h(ctx, req.Data())
			var fwd *Forwarded
			switch {
			case errors.As(err, &fwd):
				if code := fwd.Reply.Header.Get(micro.ErrorCodeHeader); code != "" {
					_ = req.Error(code, fwd.Reply.Header.Get(micro.ErrorHeader), fwd.Reply.Data)
					return
				}
				_ = req.Respond(fwd.Reply.Data)
			case err != nil:
				RespondError(req, AsAPIError(err))
			default:
				data, err := json.Marshal(res)
				if err != nil {
					RespondError(req, AsAPIError(err))
					return
				}
				_ = req.Respond(data)
			}
		}), micro.WithEndpointSubject(subject))
		if err != nil {
			return fmt.Errorf("endpoint %s: %w", subject, err)
		}
	}
	return nil
}

// AsAPIError is err as an API error: a *Error as it is, a timeout or
// missing responder as CodeUnavailable (retryable), anything else as
// CodeInternal.
func AsAPIError(err error) error {
	var pe *Error
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return Errorf(CodeUnavailable, "%v", err)
	}
	return Errorf(CodeInternal, "%v", err)
}

// DecodeRequest reads an API request into v. An empty body is the zero
// request; an unknown field, a value of the wrong type and malformed JSON
// are refused with an invalid_argument error naming the field.
func DecodeRequest(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return decodeError(dec.Decode(v))
}

// DecodeDocument reads a stored JSON document into v, ignoring fields it
// does not know (a newer writer's), naming a field of the wrong type.
func DecodeDocument(data []byte, v any) error {
	return decodeError(json.Unmarshal(data, v))
}

func decodeError(err error) error {
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return FieldError(te.Field, "cannot be a JSON %s", te.Value)
	}
	if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return FieldError(strings.Trim(field, `"`), "is not a field of this request")
	}
	return Errorf(CodeInvalidArgument, "malformed JSON: %v", err)
}

package protocol

import (
	"errors"
	"fmt"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// Error codes of errors that cross NATS: API errors and job errors
// (JobEvent.error_code, JobStatus.error_code, DeadLetter.error_code).
const (
	CodeInvalidArgument = "invalid_argument"
	CodeNotFound        = "not_found"
	CodeAlreadyExists   = "already_exists"
	CodeConflict        = "conflict"
	CodeUnavailable     = "unavailable"
	CodeInternal        = "internal"

	CodeHandlerError     = "handler_error"
	CodeTimeout          = "timeout"
	CodePanic            = "panic"
	CodeCancelled        = "cancelled"
	CodeNonRetryable     = "non_retryable"
	CodeMalformedPayload = "malformed_payload"
	CodeUnknownKind      = "unknown_kind"
	CodeInvalidHeaders   = "invalid_headers"
	CodePayloadTooLarge  = "payload_too_large"
	CodeAgentLost        = "agent_lost"
	CodeUnroutable       = "unroutable"
	CodeInvalidSubject   = "invalid_subject"
)

// Error is an error with a stable code and a retryable flag, the Go form of
// the Error document. Match it with errors.Is against a code sentinel made
// by Code, or errors.As to read its fields; never by its text.
type Error struct {
	Code      string
	Message   string
	Retryable bool
	// Field names the request field the error is about, if any.
	Field string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Is matches another *Error with the same code, so errors.Is(err,
// protocol.Code(protocol.CodeNotFound)) works across NATS.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// IsCode reports whether err carries code.
func IsCode(err error, code string) bool { return errors.Is(err, Code(code)) }

// Code returns a sentinel for errors.Is comparisons by code.
func Code(code string) *Error { return &Error{Code: code} }

// Errorf builds an *Error with a formatted message.
func Errorf(code string, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Retryable: code == CodeUnavailable}
}

// WithField sets the request field the error is about and returns e.
func (e *Error) WithField(field string) *Error {
	e.Field = field
	return e
}

// FieldError builds an invalid_argument error about field.
func FieldError(field string, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidArgument, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ToDoc converts err to its wire document; errors without a code become internal.
func ToDoc(err error) *jetfleetpb.Error {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: CodeInternal, Message: err.Error()}
	}
	return &jetfleetpb.Error{Code: e.Code, Message: e.Message, Retryable: e.Retryable, Field: e.Field}
}

// FromDoc converts a wire document to an error; nil when the code is empty.
func FromDoc(doc *jetfleetpb.Error) error {
	if doc == nil || doc.GetCode() == "" {
		return nil
	}
	return &Error{Code: doc.GetCode(), Message: doc.GetMessage(), Retryable: doc.GetRetryable(), Field: doc.GetField()}
}

package scheduler

import (
	"fmt"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

const maxTextLength = 1024

// Validate checks a schedule definition for what does not depend on the
// current time or on the server, and returns a *protocol.Error naming the
// first bad field. The scheduler checks every definition it stores this way.
func Validate(s *jetfleet.Schedule) error {
	_, err := compile(s)
	return err
}

func validDuration(field string, d jetfleet.Duration, allowZero bool) error {
	switch {
	case !d.Valid():
		return protocol.FieldError(field, "is not a duration such as \"30s\" or \"1m30s\"")
	case d < 0:
		return protocol.FieldError(field, "must not be negative")
	case d == 0 && !allowZero:
		return protocol.FieldError(field, "is required")
	}
	return nil
}

func wholeSeconds(field string, d time.Duration) error {
	if d%time.Second != 0 {
		return protocol.FieldError(field, "must be a whole number of seconds, got %s", d)
	}
	return nil
}

// validateSubjectFilter checks a NATS subject filter.
func validateSubjectFilter(field, subject string) error {
	if subject == "" {
		return protocol.FieldError(field, "is required")
	}
	tokens := strings.Split(subject, ".")
	for i, tok := range tokens {
		switch {
		case tok == "":
			return protocol.FieldError(field, "subject %q has an empty token", subject)
		case strings.ContainsAny(tok, " \t\r\n"):
			return protocol.FieldError(field, "subject %q contains white space", subject)
		case tok == ">" && i != len(tokens)-1:
			return protocol.FieldError(field, "in subject %q, '>' must be the last token", subject)
		case tok != "*" && tok != ">" && strings.ContainsAny(tok, "*>"):
			return protocol.FieldError(field, "in subject %q, wildcards must be whole tokens", subject)
		}
	}
	return nil
}

func fieldf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

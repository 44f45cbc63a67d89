package protocol

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Progress reports (docs/protocol.md §3.9).
const (
	// MaxProgressMessage bounds a progress event's progress_message, in
	// bytes of UTF-8.
	MaxProgressMessage = 256
	// ProgressEventInterval is the least time between two progress events
	// of one attempt: an agent publishes at most one a second, the latest
	// report, however often its handler reports.
	ProgressEventInterval = time.Second
)

// ValidateProgress checks a progress fraction: a number from 0 to 1. NaN,
// infinities and anything outside the range are refused, never clamped.
func ValidateProgress(fraction float64) error {
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return fmt.Errorf("progress fraction %v is not a number from 0 to 1", fraction)
	}
	return nil
}

// ProgressMessage makes message fit a progress event: invalid UTF-8 and
// control characters (a newline included) become spaces, and it is cut to
// at most MaxProgressMessage bytes on a character boundary.
func ProgressMessage(message string) string {
	clean := true
	for _, r := range message {
		if r == utf8.RuneError || unicode.IsControl(r) {
			clean = false
			break
		}
	}
	if !clean {
		message = strings.Map(func(r rune) rune {
			if r == utf8.RuneError || unicode.IsControl(r) {
				return ' '
			}
			return r
		}, strings.ToValidUTF8(message, " "))
	}
	if len(message) <= MaxProgressMessage {
		return message
	}
	cut := MaxProgressMessage
	for cut > 0 && !utf8.RuneStart(message[cut]) {
		cut--
	}
	return message[:cut]
}

package jetfleet

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// Duration is a time.Duration written in JSON as a string of seconds with
// an "s" suffix ("90s", "1.5s"), the proto3 JSON form the rest of the
// protocol uses. It reads any Go duration string ("1m30s", "250ms") too.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like MarshalJSON without the quotes.
func (d Duration) String() string {
	return strconv.FormatFloat(time.Duration(d).Seconds(), 'f', -1, 64) + "s"
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// invalidDuration marks a value that did not parse. Decoding does not fail
// on it, so that validation can name the field (encoding/json drops the
// field path of errors returned by UnmarshalJSON).
const invalidDuration = Duration(math.MinInt64)

// UnmarshalJSON implements json.Unmarshaler. A value that is not a duration
// string decodes as invalid and is reported by the scheduler, naming the field.
func (d *Duration) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		*d = invalidDuration
		return nil //nolint:nilerr // reported by validation, naming the field (see invalidDuration)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		*d = invalidDuration
		return nil //nolint:nilerr // reported by validation, naming the field (see invalidDuration)
	}
	*d = Duration(v)
	return nil
}

// Valid reports whether d decoded from a duration string (see UnmarshalJSON).
func (d Duration) Valid() bool { return d != invalidDuration }

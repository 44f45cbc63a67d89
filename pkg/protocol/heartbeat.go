package protocol

import (
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// FreshIntervals is how many of an agent's heartbeat intervals its entry in
// bucket agents stays fresh after it was stored (docs/protocol.md §3.4).
const FreshIntervals = 3

// HeartbeatInterval is the interval a heartbeat announces, at least 1s:
// the unit of an entry's freshness.
func HeartbeatInterval(hb *jetfleetpb.Heartbeat) time.Duration {
	return max(hb.GetInterval().AsDuration(), time.Second)
}

// RegistrationFresh reports whether an agent's entry in bucket agents,
// stored at stored, is fresh: stored within FreshIntervals of its
// heartbeat intervals of newest, the latest storage time of any entry of
// the bucket. Both times are the server's, so the hosts' clocks need not
// agree; the bucket's TTL drops a stale entry only later.
func RegistrationFresh(hb *jetfleetpb.Heartbeat, stored, newest time.Time) bool {
	return newest.Sub(stored) <= FreshIntervals*HeartbeatInterval(hb)
}

// RegistrationLive reports whether an entry is a live agent that takes
// jobs: fresh and not draining.
func RegistrationLive(hb *jetfleetpb.Heartbeat, stored, newest time.Time) bool {
	return !hb.GetDraining() && RegistrationFresh(hb, stored, newest)
}

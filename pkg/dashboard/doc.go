// Package dashboard is jetfleet's web dashboard: the fleet's state, every
// schedule's and job kind's last runs and trends, every job's timeline,
// payload and trace, and the operator actions (pause, resume, trigger,
// backfill, replay, purge, cancel) — server-rendered HTML from html/template
// with embedded assets, SVG charts drawn on the server, and live updates
// over server-sent events.
//
// A Dashboard is a lifecycle component on one NATS connection. It reads
// through the client package (pkg/jetfleet) and the streams, and holds one
// set of NATS subscriptions (the hub: every event, every alert, and watches
// of the buckets schedules, schedule_state and agents) whatever the number
// of browsers; it keeps nothing that matters, so any number of replicas
// may serve the same fleet.
//
// It serves loopback only unless credentials are configured (Config.Auth:
// users or tokens with the roles viewer and operator); actions need the
// operator role, carry a CSRF token and are recorded as protocol.Audit
// events beside what they acted on. docs/dashboard.md describes the views,
// the configuration and the tests.
package dashboard

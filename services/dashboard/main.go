// Command dashboard runs one replica of the jetfleet web dashboard: the
// fleet's state, every job's runs and trends, and operator actions, live in
// the browser. Run as many replicas as you like; they keep nothing. See
// docs/dashboard.md.
package main

import (
	"context"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func main() {
	cfg := dashboard.DefaultServiceConfig()
	service.Main("dashboard", cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		// cfg is loaded by now: read the dashboard section here, not before Main.
		return dashboard.BuildFunc(cfg.Dashboard)(ctx, env, http)
	})
}

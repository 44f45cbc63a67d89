package dashboard

import (
	"context"
	"errors"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// ServiceConfig is the whole configuration of the dashboard service.
type ServiceConfig struct {
	service.Base `koanf:",squash"`
	Dashboard    Config `koanf:"dashboard"`
}

// DefaultHTTPAddr is where the dashboard service serves /metrics, /healthz
// and /readyz unless configured otherwise (the pages are on dashboard.listen).
const DefaultHTTPAddr = "127.0.0.1:9104"

// DefaultServiceConfig returns the service's defaults.
func DefaultServiceConfig() *ServiceConfig {
	c := &ServiceConfig{}
	c.Telemetry.HTTPAddr = DefaultHTTPAddr
	return c
}

// ApplyDefaults implements service.Defaulter.
func (c *ServiceConfig) ApplyDefaults() {
	c.Base.ApplyDefaults()
	c.Dashboard = c.Dashboard.WithDefaults()
}

// Validate checks the shared sections and the dashboard section.
func (c *ServiceConfig) Validate() error {
	return errors.Join(c.Base.Validate(), c.Dashboard.Validate("dashboard"))
}

// BuildFunc returns the service.BuildFunc of the dashboard service.
func BuildFunc(cfg Config) service.BuildFunc {
	return func(_ context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		d, err := New(cfg, env.Conn, Options{Logger: env.ComponentLogger("dashboard"), Name: env.Name})
		if err != nil {
			return nil, err
		}
		if http != nil {
			http.AddReadyCheck("dashboard", d.Ready)
		}
		return d, nil
	}
}

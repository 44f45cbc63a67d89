package dashboard

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
)

// Config is the dashboard section of the configuration (koanf
// "dashboard"). Zero values mean the documented default.
type Config struct {
	// Listen is the HTTP address. Defaults to 127.0.0.1:8080. An address
	// that is not loopback (an interface address, or every interface as in
	// ":8080") is refused unless credentials are configured (Auth).
	Listen string `koanf:"listen"`
	// Auth holds the credentials and their roles.
	Auth AuthConfig `koanf:"auth"`
	// Jaeger: where the trace of a run is shown and read.
	Jaeger JaegerConfig `koanf:"jaeger"`
	// PageSize is the rows of a list page. Defaults to 50; at most 1000.
	PageSize int `koanf:"page_size"`
	// Executions is how many of a schedule's or kind's last runs are shown.
	// Defaults to 50.
	Executions int `koanf:"executions"`
	// MaxLiveClients bounds the browsers following live updates at once
	// (server-sent events); more get 503. Defaults to 1000.
	MaxLiveClients int `koanf:"max_live_clients"`
	// LiveInterval is the shortest time between two updates sent to one
	// browser (updates in between are merged). Defaults to 1s.
	LiveInterval time.Duration `koanf:"live_interval"`
	// RequestTimeout bounds each call to NATS a page makes. Defaults to 10s.
	RequestTimeout time.Duration `koanf:"request_timeout"`
}

// AuthConfig holds the dashboard's credentials. Each credential has a role:
// viewer (read-only; "read-only" is accepted too) or operator (may act).
// With none configured the dashboard is open — and then only on loopback.
type AuthConfig struct {
	// UsersFile lists users, one per line: name:password:role. Blank lines
	// and lines starting with # are skipped.
	UsersFile string `koanf:"users_file"`
	// TokensFile lists API tokens, one per line: token:role[:name].
	TokensFile string `koanf:"tokens_file"`
	// Users and Tokens are the same lists inline, comma-separated
	// (JETFLEET_DASHBOARD_AUTH_USERS, JETFLEET_DASHBOARD_AUTH_TOKENS).
	Users  string `koanf:"users" secret:"true"`
	Tokens string `koanf:"tokens" secret:"true"`
	// SessionTTL is how long a login lasts. Defaults to 12h.
	SessionTTL time.Duration `koanf:"session_ttl"`
	// SessionSecret signs session cookies; replicas must share it. Defaults
	// to a key derived from the credentials (which replicas share anyway).
	SessionSecret string `koanf:"session_secret" secret:"true"`
}

// JaegerConfig says where traces are.
type JaegerConfig struct {
	// QueryURL is the base URL of Jaeger's query API (http://jaeger:16686):
	// the job page draws the run's spans from <QueryURL>/api/traces/<id>.
	// Empty: no waterfall.
	QueryURL string `koanf:"query_url"`
	// UIURL is the base URL of Jaeger's UI for the "open in Jaeger" link.
	// Defaults to QueryURL.
	UIURL string `koanf:"ui_url"`
	// Timeout bounds a trace fetch. Defaults to 2s.
	Timeout time.Duration `koanf:"timeout"`
}

// Defaults of Config.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultPageSize       = 50
	DefaultExecutions     = 50
	DefaultMaxLiveClients = 1000
	DefaultLiveInterval   = time.Second
	DefaultRequestTimeout = 10 * time.Second
	DefaultSessionTTL     = 12 * time.Hour
	DefaultJaegerTimeout  = 2 * time.Second
)

// WithDefaults returns c with zero values replaced by their defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.Executions == 0 {
		c.Executions = DefaultExecutions
	}
	if c.MaxLiveClients == 0 {
		c.MaxLiveClients = DefaultMaxLiveClients
	}
	if c.LiveInterval == 0 {
		c.LiveInterval = DefaultLiveInterval
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Auth.SessionTTL == 0 {
		c.Auth.SessionTTL = DefaultSessionTTL
	}
	if c.Jaeger.UIURL == "" {
		c.Jaeger.UIURL = c.Jaeger.QueryURL
	}
	if c.Jaeger.Timeout == 0 {
		c.Jaeger.Timeout = DefaultJaegerTimeout
	}
	return c
}

// Validate checks c; keys are reported below section. The credentials
// files are read here too, so a missing or malformed one names its key.
func (c Config) Validate(section string) error {
	key := func(k string) string { return section + "." + k }
	var errs []error
	d := c.WithDefaults()
	host, _, err := net.SplitHostPort(d.Listen)
	if err != nil {
		errs = append(errs, config.Invalid(key("listen"), "must be host:port, got %q", d.Listen))
	}
	creds, cerr := loadCredentials(d.Auth, key("auth"))
	if cerr != nil {
		errs = append(errs, cerr)
	}
	if err == nil && !isLoopback(host) && cerr == nil && creds.empty() {
		errs = append(errs, config.Invalid(key("listen"),
			"%s is not a loopback address: the dashboard refuses to serve it without credentials (set %s, %s, %s or %s)",
			d.Listen, key("auth.users_file"), key("auth.tokens_file"), key("auth.users"), key("auth.tokens")))
	}
	if c.PageSize < 0 || c.PageSize > 1000 {
		errs = append(errs, config.Invalid(key("page_size"), "must be 0 (default %d) to 1000", DefaultPageSize))
	}
	if c.Executions < 0 || c.Executions > 1000 {
		errs = append(errs, config.Invalid(key("executions"), "must be 0 (default %d) to 1000", DefaultExecutions))
	}
	if c.MaxLiveClients < 0 {
		errs = append(errs, config.Invalid(key("max_live_clients"), "must not be negative"))
	}
	for k, v := range map[string]time.Duration{"live_interval": c.LiveInterval, "request_timeout": c.RequestTimeout,
		"auth.session_ttl": c.Auth.SessionTTL, "jaeger.timeout": c.Jaeger.Timeout} {
		if v < 0 {
			errs = append(errs, config.Invalid(key(k), "must not be negative, got %s", v))
		}
	}
	for k, v := range map[string]string{"jaeger.query_url": c.Jaeger.QueryURL, "jaeger.ui_url": c.Jaeger.UIURL} {
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, config.Invalid(key(k), "must be an http or https URL, got %q", v))
		}
	}
	return errors.Join(errs...)
}

// isLoopback reports whether host (of a listen address) only accepts
// connections from this machine.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c Config) String() string { return fmt.Sprintf("dashboard on %s", c.WithDefaults().Listen) }

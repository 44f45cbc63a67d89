package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Dashboard is one replica of the web dashboard: an HTTP server rendering
// the fleet's state from NATS, and one set of NATS subscriptions (the hub)
// feeding live updates to every browser. It keeps nothing that matters:
// run any number of replicas. It is a lifecycle.Component.
type Dashboard struct {
	cfg    Config
	creds  *credentials
	nc     *nats.Conn
	js     jetstream.JetStream
	client *jetfleet.Client
	log    *slog.Logger
	name   string
	now    func() time.Time

	pages map[string]*template.Template
	hub   *hub
	srv   *http.Server
	ln    net.Listener
	http  *http.Client

	runner lifecycle.Runner
	// closing is closed by Stop: live streams end, so that the server's
	// shutdown does not wait for them.
	closing   chan struct{}
	closeOnce sync.Once
}

// Options are what a service passes besides the configuration.
type Options struct {
	// Logger defaults to one that discards.
	Logger *slog.Logger
	// Name is the replica's name in audit records. Defaults to "dashboard".
	Name string
	// Now is the clock of pages (ages, relative filters). Defaults to time.Now.
	Now func() time.Time
}

// New builds a dashboard on nc (which the caller keeps owning). cfg is
// validated, and the credentials files are read, here.
func New(cfg Config, nc *nats.Conn, opts Options) (*Dashboard, error) {
	if nc == nil {
		return nil, errors.New("dashboard: needs a NATS connection")
	}
	if err := cfg.Validate("dashboard"); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	creds, err := loadCredentials(cfg.Auth, "dashboard.auth")
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	d := &Dashboard{cfg: cfg, creds: creds, nc: nc, js: js, client: jetfleet.NewClient(nc), log: opts.Logger,
		name: opts.Name, now: opts.Now, closing: make(chan struct{}), http: &http.Client{Timeout: cfg.Jaeger.Timeout}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.name == "" {
		d.name = "dashboard"
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.pages, err = parsePages(); err != nil {
		return nil, err
	}
	d.hub = newHub(d)
	return d, nil
}

// Name implements lifecycle.Named.
func (d *Dashboard) Name() string { return "dashboard" }

// Start subscribes (the hub), then listens and serves.
func (d *Dashboard) Start(ctx context.Context) error {
	runCtx, err := d.runner.Begin(ctx)
	if err != nil {
		return err
	}
	if err := d.hub.start(ctx, runCtx); err != nil {
		_ = d.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("dashboard: subscribe: %w", err)
	}
	d.runner.Go(d.hub.run)
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		_ = d.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("dashboard: %w", err)
	}
	d.ln = ln
	d.srv = &http.Server{Handler: d.routes(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return runCtx }}
	d.runner.Go(func(context.Context) {
		if err := d.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("dashboard: serve", telemetry.LogError, err)
		}
	})
	mode := "credentials required"
	if d.creds.empty() {
		mode = "open (loopback, no credentials configured)"
	}
	d.log.Info("dashboard serving", "url", d.URL(), "auth", mode)
	return nil
}

// URL is where the dashboard serves (after Start).
func (d *Dashboard) URL() string {
	if d.ln == nil {
		return "http://" + d.cfg.Listen
	}
	addr := d.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, fmt.Sprint(addr.Port))
}

// Stop stops serving (live streams end), then unsubscribes. It is bounded
// by ctx and safe to call twice.
func (d *Dashboard) Stop(ctx context.Context) error {
	var errs []error
	d.closeOnce.Do(func() { close(d.closing) }) // live streams end first
	if d.srv != nil {
		errs = append(errs, ignoreClosed(d.srv.Shutdown(ctx)))
	}
	errs = append(errs, d.runner.Stop(ctx))
	d.hub.stop()
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// Done is closed once the dashboard's goroutines have returned after Stop.
func (d *Dashboard) Done() <-chan struct{} { return d.runner.Done() }

// Ready reports whether the dashboard serves.
func (d *Dashboard) Ready(context.Context) error {
	if d.ln == nil {
		return errors.New("not serving yet")
	}
	if !d.nc.IsConnected() {
		return fmt.Errorf("NATS %s", d.nc.Status())
	}
	return nil
}

func parsePages() (map[string]*template.Template, error) {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/partials.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" || name == "partials" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", n, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// requestCtx bounds one page's calls to NATS.
func (d *Dashboard) requestCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), d.cfg.RequestTimeout)
}

// record stores an operator action (audit) beside what it acted on; a
// failure to record is logged, never hidden.
func (d *Dashboard) record(r *http.Request, subject string, a protocol.Audit, actErr error) {
	p := principalOf(r.Context())
	a.Actor, a.Source = actor(p, r), d.name
	if p != nil {
		a.Role = p.Role
	}
	a.Time = d.now().UTC()
	if actErr != nil {
		a.Outcome, a.Error = "failed", actErr.Error()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), d.cfg.RequestTimeout)
	defer cancel()
	if err := d.client.RecordAction(ctx, subject, &a); err != nil {
		d.log.Error("dashboard: action not recorded", "action", a.Action, "actor", a.Actor, telemetry.LogError, err)
	}
	d.log.Info("dashboard action", "action", a.Action, "actor", a.Actor, "role", a.Role, "job_id", a.JobID,
		"schedule_id", a.ScheduleID, "dlq_sequence", a.DLQSequence, "detail", a.Detail, "outcome", a.Outcome, "error", a.Error)
}

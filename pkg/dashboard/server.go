package dashboard

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// page is what every page's template gets.
type page struct {
	Title string
	// Nav is the active section of the navigation.
	Nav  string
	User *principal
	// AuthEnabled: credentials are configured (a login, a logout).
	AuthEnabled bool
	CSRF        string
	Flash       string
	FlashError  bool
	// Live lists the topics whose changes refresh the page's main part.
	Live string
	Now  time.Time
	// Query is the page's filter as a query string (links keep it).
	Query url.Values
	// Body is the page's own data.
	Body any
}

func (d *Dashboard) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /login", d.loginPage)
	mux.HandleFunc("POST /login", d.loginSubmit)
	mux.HandleFunc("POST /logout", d.logout)
	mux.HandleFunc("GET /{$}", d.overview)
	mux.HandleFunc("GET /schedules", d.scheduleList)
	mux.HandleFunc("GET /schedules/{id}", d.scheduleDetail)
	mux.HandleFunc("GET /kinds", d.kindList)
	mux.HandleFunc("GET /kinds/{queue}/{kind}", d.kindDetail)
	mux.HandleFunc("GET /jobs", d.jobList)
	mux.HandleFunc("GET /jobs/{id...}", d.jobDetail)
	mux.HandleFunc("GET /lookup", d.lookup)
	mux.HandleFunc("GET /running", d.running)
	mux.HandleFunc("GET /dlq", d.dlqList)
	mux.HandleFunc("GET /dlq/{seq}", d.dlqDetail)
	mux.HandleFunc("GET /agents", d.agents)
	mux.HandleFunc("GET /workflows", d.workflowList)
	mux.HandleFunc("GET /workflows/runs/{id}", d.workflowRun)
	mux.HandleFunc("GET /live", d.live)
	mux.HandleFunc("POST /actions/schedule/{action}", d.scheduleAction)
	mux.HandleFunc("POST /actions/dlq/{action}", d.dlqAction)
	mux.HandleFunc("POST /actions/job/cancel", d.cancelAction)
	mux.HandleFunc("POST /actions/workflow/{action}", d.workflowRunAction)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, http.StatusNotFound, fmt.Sprintf("There is no page at %s.", r.URL.Path))
	})
	return d.secure(d.recover(d.authenticate(mux)))
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		h.ServeHTTP(w, r)
	})
}

// secure sets the headers every answer carries.
func (d *Dashboard) secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

func (d *Dashboard) recover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler { //nolint:errorlint // the value given to panic, compared as net/http does
					panic(v)
				}
				d.log.Error("dashboard: panic", "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				d.fail(w, r, http.StatusInternalServerError, "The dashboard failed on this page; the error is logged.")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticate lets through the login page, static files and the health
// check; anything else needs a principal when credentials are configured.
func (d *Dashboard) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		if path == "/login" || path == "/healthz" || strings.HasPrefix(path, "/static/") {
			next.ServeHTTP(w, r)
			return
		}
		var p *principal
		if d.creds.empty() {
			p = &principal{Name: "anonymous", Role: RoleOperator, Anonymous: true}
		} else if p = d.creds.authenticate(r, d.now()); p == nil {
			d.refuse(w, r)
			return
		}
		next.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), p)))
	})
}

// refuse answers a request without valid credentials: 401, with the login
// form for a browser.
func (d *Dashboard) refuse(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "" || !strings.Contains(r.Header.Get("Accept"), "text/html") {
		// Not to a browser, whose own dialog would hide the login form.
		w.Header().Set("WWW-Authenticate", `Basic realm="jetfleet dashboard", charset="UTF-8"`)
		http.Error(w, "401 unauthorized: log in (a session cookie, basic credentials or a bearer token)", http.StatusUnauthorized)
		return
	}
	next := r.URL.RequestURI()
	if r.Method != http.MethodGet {
		next = "/"
	}
	d.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in", Body: loginBody{Next: next}})
}

// render executes a page; with ?fragment=1 only its main part (live updates).
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t := d.pages[name]
	if t == nil {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	p.User = principalOf(r.Context())
	p.AuthEnabled = !d.creds.empty()
	p.CSRF = csrfToken(w, r)
	p.Now = d.now()
	if ck, err := r.Cookie(flashCookie); err == nil && r.URL.Query().Get("fragment") == "" {
		if v, err := url.QueryUnescape(ck.Value); err == nil {
			p.Flash, p.FlashError = strings.CutPrefix(v, "!")
		}
		http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: "/", MaxAge: -1})
	}
	entry := "layout.html"
	if r.URL.Query().Get("fragment") != "" {
		entry = "main"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, entry, p); err != nil {
		d.log.Error("dashboard: render", "page", name, telemetry.LogError, err)
		http.Error(w, "render failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorBody struct {
	Status  int
	Message string
}

// fail renders an error page.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	title := http.StatusText(status)
	d.render(w, r, status, "error", page{Title: title, Body: errorBody{Status: status, Message: msg}})
}

// failErr maps an error of a NATS call to a page: a bad filter is 400, an
// unknown thing 404, a service that does not answer 503.
func (d *Dashboard) failErr(w http.ResponseWriter, r *http.Request, err error) {
	var qe *queryError
	switch {
	case errors.As(err, &qe):
		d.fail(w, r, http.StatusBadRequest, "Malformed filter: "+qe.Error())
	case protocol.IsCode(err, protocol.CodeInvalidArgument):
		d.fail(w, r, http.StatusBadRequest, err.Error())
	case protocol.IsCode(err, protocol.CodeNotFound):
		d.fail(w, r, http.StatusNotFound, err.Error())
	case protocol.IsCode(err, protocol.CodeUnavailable):
		d.fail(w, r, http.StatusServiceUnavailable, err.Error())
	default:
		d.log.Warn("dashboard: page failed", "path", r.URL.Path, telemetry.LogError, err)
		d.fail(w, r, http.StatusBadGateway, "The fleet did not answer as expected: "+err.Error())
	}
}

// flash sets the message shown once on the next page.
func flash(w http.ResponseWriter, msg string, isErr bool) {
	if isErr {
		msg = "!" + msg
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: url.QueryEscape(msg), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: 60})
}

// back redirects to the page an action came from (a local path only).
func back(w http.ResponseWriter, r *http.Request, fallback string) {
	to := r.PostFormValue("back")
	if !strings.HasPrefix(to, "/") || strings.HasPrefix(to, "//") || strings.Contains(to, "\\") {
		to = fallback
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

package dashboard

import (
	"context"
	"net/http"
	"strings"
)

type loginBody struct {
	Next  string
	Error string
}

func withPrincipal(ctx context.Context, p *principal) context.Context {
	return context.WithValue(ctx, principalKey, p)
}

func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return "/"
	}
	return next
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	if d.creds.empty() {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	d.render(w, r, http.StatusOK, "login", page{Title: "Log in", Body: loginBody{Next: safeNext(r.URL.Query().Get("next"))}})
}

func (d *Dashboard) loginSubmit(w http.ResponseWriter, r *http.Request) {
	if err := checkCSRF(r); err != nil {
		d.fail(w, r, http.StatusForbidden, err.Error())
		return
	}
	next := safeNext(r.PostFormValue("next"))
	p, ok := d.creds.login(r.PostFormValue("user"), r.PostFormValue("password"), strings.TrimSpace(r.PostFormValue("token")))
	if d.creds.empty() || !ok {
		d.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in",
			Body: loginBody{Next: next, Error: "Wrong name, password or token."}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: d.creds.sessionValue(*p, d.cfg.Auth.SessionTTL, d.now()),
		Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isTLS(r), MaxAge: int(d.cfg.Auth.SessionTTL.Seconds())})
	d.log.Info("dashboard login", "actor", p.Name, "role", p.Role)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if err := checkCSRF(r); err != nil {
		d.fail(w, r, http.StatusForbidden, err.Error())
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Path: "/", MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

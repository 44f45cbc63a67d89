package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
)

// Roles.
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
)

// principal is who makes a request.
type principal struct {
	Name string
	Role string
	// Anonymous is set on a dashboard without credentials (loopback only):
	// everyone is an operator, named by address.
	Anonymous bool
}

func (p *principal) CanAct() bool { return p != nil && p.Role == RoleOperator }

type credentials struct {
	users  map[string]userCred // by name
	tokens map[string]principal
	secret []byte
}

type userCred struct {
	password string
	role     string
}

func (c *credentials) empty() bool { return len(c.users) == 0 && len(c.tokens) == 0 }

func normRole(role string) (string, bool) {
	switch strings.TrimSpace(role) {
	case "operator":
		return RoleOperator, true
	case "viewer", "read-only", "readonly":
		return RoleViewer, true
	}
	return "", false
}

// loadCredentials reads the users and tokens of a (files and inline lists).
func loadCredentials(a AuthConfig, section string) (*credentials, error) {
	c := &credentials{users: map[string]userCred{}, tokens: map[string]principal{}}
	var lines []struct{ key, line string }
	add := func(key, text, sep string) {
		for _, l := range strings.Split(text, sep) {
			l = strings.TrimSpace(l)
			if l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, struct{ key, line string }{key, l})
			}
		}
	}
	for _, f := range []struct{ key, path string }{{"users_file", a.UsersFile}, {"tokens_file", a.TokensFile}} {
		if f.path == "" {
			continue
		}
		data, err := os.ReadFile(f.path)
		if err != nil {
			return nil, config.Invalid(section+"."+f.key, "%v", err)
		}
		add(f.key, string(data), "\n")
	}
	add("users", a.Users, ",")
	add("tokens", a.Tokens, ",")
	var material []string
	for i, l := range lines {
		parts := strings.Split(l.line, ":")
		isUsers := strings.HasPrefix(l.key, "users")
		if (isUsers && len(parts) != 3) || (!isUsers && len(parts) != 2 && len(parts) != 3) {
			want := "name:password:role"
			if !isUsers {
				want = "token:role[:name]"
			}
			return nil, config.Invalid(section+"."+l.key, "entry %d is not %s", i+1, want)
		}
		role, ok := normRole(parts[len(parts)-1])
		if !isUsers {
			role, ok = normRole(parts[1])
		}
		if !ok {
			return nil, config.Invalid(section+"."+l.key, "entry %d: role must be viewer (read-only) or operator", i+1)
		}
		if isUsers {
			if parts[0] == "" || parts[1] == "" {
				return nil, config.Invalid(section+"."+l.key, "entry %d: name and password must not be empty", i+1)
			}
			c.users[parts[0]] = userCred{password: parts[1], role: role}
		} else {
			if len(parts[0]) < 16 {
				return nil, config.Invalid(section+"."+l.key, "entry %d: a token must have at least 16 characters", i+1)
			}
			name := "token-" + hex.EncodeToString(sha([]byte(parts[0]))[:4])
			if len(parts) == 3 && parts[2] != "" {
				name = parts[2]
			}
			c.tokens[parts[0]] = principal{Name: name, Role: role}
		}
		material = append(material, l.line)
	}
	sort.Strings(material)
	secret := a.SessionSecret
	if secret == "" {
		secret = strings.Join(material, "\n")
	}
	c.secret = sha([]byte("jetfleet-dashboard-session\x00" + secret))
	return c, nil
}

func sha(b []byte) []byte {
	h := sha256.Sum256(b)
	return h[:]
}

const (
	sessionCookie = "jetfleet_session"
	csrfCookie    = "jetfleet_csrf"
	flashCookie   = "jetfleet_flash"
)

type session struct {
	Name    string `json:"n"`
	Role    string `json:"r"`
	Expires int64  `json:"e"`
}

func (c *credentials) sign(payload []byte) []byte {
	m := hmac.New(sha256.New, c.secret)
	m.Write(payload)
	return m.Sum(nil)
}

func (c *credentials) sessionValue(p principal, ttl time.Duration, now time.Time) string {
	payload, _ := json.Marshal(session{Name: p.Name, Role: p.Role, Expires: now.Add(ttl).Unix()})
	return base64.RawURLEncoding.EncodeToString(payload) + "." + base64.RawURLEncoding.EncodeToString(c.sign(payload))
}

func (c *credentials) parseSession(v string, now time.Time) (*principal, bool) {
	p64, s64, ok := strings.Cut(v, ".")
	if !ok {
		return nil, false
	}
	payload, err1 := base64.RawURLEncoding.DecodeString(p64)
	sig, err2 := base64.RawURLEncoding.DecodeString(s64)
	if err1 != nil || err2 != nil || !hmac.Equal(sig, c.sign(payload)) {
		return nil, false
	}
	var s session
	if json.Unmarshal(payload, &s) != nil || now.Unix() > s.Expires {
		return nil, false
	}
	role, ok := normRole(s.Role)
	if !ok {
		return nil, false
	}
	return &principal{Name: s.Name, Role: role}, true
}

// login checks a user's password or a token.
func (c *credentials) login(user, password, token string) (*principal, bool) {
	if token != "" {
		for t, p := range c.tokens {
			if subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1 {
				return &p, true
			}
		}
		return nil, false
	}
	u, ok := c.users[user]
	if !ok {
		subtle.ConstantTimeCompare([]byte(password), []byte(password)) // same work for unknown users
		return nil, false
	}
	if subtle.ConstantTimeCompare([]byte(u.password), []byte(password)) != 1 {
		return nil, false
	}
	return &principal{Name: user, Role: u.role}, true
}

// authenticate finds who makes r: a bearer token, basic credentials, or a
// session cookie; nil when none proves anyone.
func (c *credentials) authenticate(r *http.Request, now time.Time) *principal {
	if h := r.Header.Get("Authorization"); h != "" {
		if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
			p, _ := c.login("", "", strings.TrimSpace(tok))
			return p
		}
		if user, pass, ok := r.BasicAuth(); ok {
			p, _ := c.login(user, pass, "")
			return p
		}
		return nil
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		if p, ok := c.parseSession(ck.Value, now); ok {
			return p
		}
	}
	return nil
}

type ctxKey int

const principalKey ctxKey = 1

func principalOf(ctx context.Context) *principal {
	p, _ := ctx.Value(principalKey).(*principal)
	return p
}

// actor names p for the audit record.
func actor(p *principal, r *http.Request) string {
	if p == nil {
		return "unknown"
	}
	if p.Anonymous {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		return "anonymous@" + host
	}
	return p.Name
}

// csrfToken returns the request's CSRF token (double-submit cookie),
// setting a new one when it has none.
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
		return ck.Value
	}
	if v, ok := r.Context().Value(csrfKey).(string); ok {
		return v
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isTLS(r)})
	*r = *r.WithContext(context.WithValue(r.Context(), csrfKey, v))
	return v
}

const csrfKey ctxKey = 2

// checkCSRF accepts a state-changing request only with the form field
// csrf equal to the CSRF cookie, and not from another site.
func checkCSRF(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("cross-site request refused (Sec-Fetch-Site: %s)", site)
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return fmt.Errorf("no CSRF cookie: reload the page and try again")
	}
	if subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostFormValue("csrf"))) != 1 {
		return fmt.Errorf("CSRF token missing or wrong: reload the page and try again")
	}
	return nil
}

func isTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

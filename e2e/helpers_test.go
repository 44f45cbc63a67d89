package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository's root: tests run in e2e/.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("%s does not look like the repository's root: %v", root, err)
	}
	return root
}

// Users of config/nats/accounts.conf and the variables holding their passwords.
var passwordVars = map[string]string{
	"scheduler":  "SCHEDULER_NATS_PASSWORD",
	"supervisor": "SUPERVISOR_NATS_PASSWORD",
	"agent":      "AGENT_NATS_PASSWORD",
	"client":     "CLIENT_NATS_PASSWORD",
	"admin":      "ADMIN_NATS_PASSWORD",
	"dashboard":  "DASHBOARD_NATS_PASSWORD",
}

// devPasswords reads the dev-only passwords from .env in the repository's
// root, the file docker-compose reads; as with docker-compose, a variable set
// in the environment wins. It returns user → password.
func devPasswords(t testing.TB, root string) map[string]string {
	t.Helper()
	vars, err := readDotEnv(filepath.Join(root, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for user, name := range passwordVars {
		v := os.Getenv(name)
		if v == "" {
			v = vars[name]
		}
		if v == "" {
			t.Fatalf("no password for NATS user %s: set %s in .env or the environment", user, name)
		}
		out[user] = v
	}
	return out
}

// readDotEnv reads KEY=VALUE lines; # starts a comment line.
func readDotEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want KEY=VALUE", path, n)
		}
		vars[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return vars, sc.Err()
}

// eventually calls check every interval until it returns nil, and fails the
// test with its last error after timeout. It polls state that announces no
// event (health, metrics, an API that is not up yet).
func eventually(t testing.TB, timeout, interval time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(interval)
	}
}

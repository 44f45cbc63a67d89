// Package browser tests the dashboard in a real headless Chromium (Debian's
// chromium, driven with chromedp) against a whole dev fleet in this
// process, and makes the screenshots of docs/screenshots
// (go tool task dashboard:screenshots). It fails when Chromium is missing:
// install it with `apt-get install -y chromium` (.ci/run does).
package browser

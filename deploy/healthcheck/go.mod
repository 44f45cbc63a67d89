// A tiny probe for the FROM-scratch images (no shell, curl or wget inside).
// Its own module, standard library only, deliberately NOT part of go.work:
// deploy/images.sh builds it with GOWORK=off.
module github.com/jetfleet/jetfleet/deploy/healthcheck

go 1.24

module github.com/jetfleet/jetfleet/e2e

go 1.26.8

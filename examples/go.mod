module github.com/jetfleet/jetfleet/examples

go 1.26.8

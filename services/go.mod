module github.com/jetfleet/jetfleet/services

go 1.26.8

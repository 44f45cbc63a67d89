package supervisor

import (
	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// storeAlert keeps a sent alert (its Alert document) in stream SUPERVISOR
// on jetfleet.supervisor.alerts.<key token>, so that the dashboard (any
// replica, restarted or not) shows the recent alerts. Published without
// waiting: the alert itself has gone out already.
func (a *alerter) storeAlert(key string, data []byte) {
	if err := a.s.nc.PublishMsg(&nats.Msg{Subject: protocol.AlertLogSubject(key), Data: data}); err != nil {
		a.s.log.Debug("alert not kept for the dashboard", "key", key, telemetry.LogError, err)
	}
}

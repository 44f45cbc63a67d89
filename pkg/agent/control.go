package agent

import (
	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// handleControl answers an AgentCommand sent to the agent's control subject.
func (a *Agent) handleControl(m *nats.Msg) {
	reply := func(err error) {
		if m.Reply == "" {
			return
		}
		doc := &jetfleetpb.Error{}
		if err != nil {
			doc = protocol.ToDoc(err)
		}
		data, _ := protocol.Marshal(doc)
		_ = m.Respond(data)
	}
	var cmd jetfleetpb.AgentCommand
	if err := protocol.Unmarshal(m.Data, &cmd); err != nil {
		reply(protocol.Errorf(protocol.CodeInvalidArgument, "%v", err))
		return
	}
	switch cmd.GetAction() {
	case protocol.CommandPing:
		reply(nil) // the supervisor asks whether a silent agent is alive
	case protocol.CommandCancel, protocol.CommandTimeout:
		// A job whose answer is decided (its event published, its ack or
		// NAK on the way) is no longer running, though the agent still
		// tracks it for a moment: cancelling it would change nothing, and
		// the scheduler's cancel_previous must learn that it is between
		// attempts.
		ex := a.findJob(cmd.GetJobId())
		if ex == nil || ex.settled.Load() {
			reply(protocol.Errorf(protocol.CodeNotFound, "job %s is not running on agent %s", cmd.GetJobId(), a.cfg.ID))
			return
		}
		if cmd.GetAction() == protocol.CommandTimeout {
			a.logger.Warn("timing out job on the supervisor's request", telemetry.LogJobID, cmd.GetJobId(), "reason", cmd.GetReason())
			ex.cancel(&timeoutCommandError{reason: cmd.GetReason()})
		} else {
			a.logger.Info("cancelling job on request", telemetry.LogJobID, cmd.GetJobId(), "reason", cmd.GetReason())
			ex.cancel(&cancelCommandError{reason: cmd.GetReason(), deadLetter: cmd.GetDeadLetter()})
		}
		reply(nil)
	default:
		reply(&protocol.Error{Code: protocol.CodeInvalidArgument, Field: "action", Message: "unknown action " + cmd.GetAction()})
	}
}

// Package agentservice is the agent service: its configuration (the agent
// section plus one built-in handler per job kind under handlers.<kind>) and
// its assembly into a component for service.Main. The binary is
// services/agent; config/agent.yaml is its default configuration (loaded by
// a test) and docs/agent.md describes the handlers, the security model,
// limits, exit codes and shutdown.
//
// Exec handlers take only absolute command paths: what runs must not
// depend on the agent's PATH. ServiceConfig.Validate names the key (and
// the file it came from) of every invalid setting, including settings that
// belong to the other handler type.
package agentservice

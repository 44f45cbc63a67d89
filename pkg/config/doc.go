// Package config loads a component's configuration in layers — built-in
// defaults, then YAML files, then JETFLEET_* environment variables, then
// --set key=value flags — into a struct with `koanf` tags, and validates it.
//
// Every problem is reported with the key and the layer it came from: an
// unknown key, a value of the wrong type, or a value the struct's Validate
// method rejects (return *KeyError from Validate to get the source added).
//
// Environment variables are named after keys: JETFLEET_ + the key in upper
// case with dots replaced by underscores (agent.max_jobs → JETFLEET_AGENT_MAX_JOBS).
// Keys below maps (topology.queues.<name>.ack_wait) are set through files or
// --set. Fields tagged `secret:"true"` are redacted by Print.
package config

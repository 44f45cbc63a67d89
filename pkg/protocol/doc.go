// Package protocol is the language-agnostic contract of jetfleet, defined
// once: stream, consumer and bucket names, subjects, job headers, the job
// envelope, ack subjects and the JSON documents (heartbeats, events, dead
// letters, job status, API errors) whose schemas live in proto/ and whose Go
// types are generated into package jetfleetpb.
//
// Anything here is also described in docs/protocol.md for implementers in
// other languages; change both together.
package protocol

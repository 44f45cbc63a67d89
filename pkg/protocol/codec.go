package protocol

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

var (
	marshalOptions   = protojson.MarshalOptions{UseProtoNames: true}
	unmarshalOptions = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// Marshal writes a document (a jetfleetpb message) in its wire form: the
// canonical proto3 JSON mapping with snake_case field names.
func Marshal(doc proto.Message) ([]byte, error) {
	if ev, ok := doc.(*jetfleetpb.JobEvent); ok {
		return appendJobEvent(make([]byte, 0, 512), ev), nil // the hot path: one per job
	}
	return marshalOptions.Marshal(doc)
}

// Unmarshal reads a document in any form a proto3 JSON parser accepts,
// ignoring unknown fields.
func Unmarshal(data []byte, doc proto.Message) error {
	if ev, ok := doc.(*jetfleetpb.JobEvent); ok && decodeJobEvent(data, ev) {
		return nil // the hot path: one per job for every reader of events
	}
	if err := unmarshalOptions.Unmarshal(data, doc); err != nil {
		return fmt.Errorf("decode %s: %w", doc.ProtoReflect().Descriptor().Name(), err)
	}
	return nil
}

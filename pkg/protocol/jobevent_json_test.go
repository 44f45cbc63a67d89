package protocol

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

func randomString(r *rand.Rand) string {
	alphabet := []rune("abcXYZ019 \"\\\n\t\x01\x7fé€😀<>&")
	n := r.IntN(12)
	out := make([]rune, n)
	for i := range out {
		out[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(out)
}

// randomFloat is a fraction most of the time (progress), else a value that
// takes another branch of the encoder: tiny, huge, negative zero, NaN, ±Inf.
func randomFloat(r *rand.Rand) float64 {
	switch r.IntN(10) {
	case 0:
		return []float64{math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1, 0.5}[r.IntN(6)]
	case 1:
		return r.Float64() * 1e-8
	case 2:
		return (r.Float64() - 0.5) * 1e25
	default:
		return r.Float64()
	}
}

// TestJobEventEncoderMatchesProtojson checks the hand-written JobEvent
// encoder against protojson on random events with every field, and that it
// knows every field the schema has.
func TestJobEventEncoderMatchesProtojson(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	fields := (&jetfleetpb.JobEvent{}).ProtoReflect().Descriptor().Fields()
	for i := range 2000 {
		ev := &jetfleetpb.JobEvent{}
		m := ev.ProtoReflect()
		for j := range fields.Len() {
			f := fields.Get(j)
			if r.IntN(4) == 0 {
				continue // leave some fields at their zero value
			}
			switch f.Kind() {
			case protoreflect.StringKind:
				m.Set(f, protoreflect.ValueOfString(randomString(r)))
			case protoreflect.Uint32Kind:
				m.Set(f, protoreflect.ValueOfUint32(r.Uint32()))
			case protoreflect.Uint64Kind:
				m.Set(f, protoreflect.ValueOfUint64(r.Uint64()))
			case protoreflect.DoubleKind:
				m.Set(f, protoreflect.ValueOfFloat64(randomFloat(r)))
			case protoreflect.BytesKind:
				m.Set(f, protoreflect.ValueOfBytes([]byte(randomString(r))))
			case protoreflect.MessageKind:
				switch f.Message().FullName() {
				case "google.protobuf.Timestamp":
					ts := timestamppb.New(time.Unix(r.Int64N(4e9), int64(r.IntN(4))*[]int64{0, 1e6, 1e3, 1}[r.IntN(4)]*int64(r.IntN(999)+1)))
					m.Set(f, protoreflect.ValueOfMessage(ts.ProtoReflect()))
				case "google.protobuf.Duration":
					d := durationpb.New(time.Duration(r.Int64N(1e13) - 5e12))
					m.Set(f, protoreflect.ValueOfMessage(d.ProtoReflect()))
				default:
					t.Fatalf("field %s has a message type the test does not know", f.Name())
				}
			default:
				t.Fatalf("field %s has kind %s the test does not know", f.Name(), f.Kind())
			}
		}
		fast, err := Marshal(ev)
		require.NoError(t, err)
		var decoded jetfleetpb.JobEvent
		require.NoError(t, protojson.Unmarshal(fast, &decoded), "event %d: %s", i, fast)
		// protojson refuses invalid UTF-8, so both sides compare after repair.
		want := proto.Clone(ev).(*jetfleetpb.JobEvent)
		wm := want.ProtoReflect()
		for j := range fields.Len() {
			f := fields.Get(j)
			if f.Kind() == protoreflect.StringKind && wm.Has(f) {
				wm.Set(f, protoreflect.ValueOfString(ToValidUTF8(wm.Get(f).String())))
			}
			if f.Kind() == protoreflect.DoubleKind && m.Has(f) {
				wm.Set(f, m.Get(f)) // proto.Clone drops a -0, which protojson writes
			}
		}
		require.True(t, proto.Equal(want, &decoded), "event %d:\nwant %v\ngot  %v\njson %s", i, want, &decoded, fast)
		if slow, err := marshalOptions.Marshal(want); err == nil {
			var viaSlow jetfleetpb.JobEvent
			require.NoError(t, protojson.Unmarshal(slow, &viaSlow))
			require.True(t, proto.Equal(&viaSlow, &decoded))
		}
	}
}

func BenchmarkMarshalJobEvent(b *testing.B) {
	ev := &jetfleetpb.JobEvent{Type: "succeeded", JobId: "order-42", Queue: "default", Kind: "send-email", Attempt: 1,
		MaxAttempts: 5, AgentId: "host-1-42-abc", Time: timestamppb.Now(), Duration: durationpb.New(3 * time.Millisecond),
		TraceId: "0af7651916cd43dd8448eb211c80319c", StreamSequence: 12345, StartedAt: timestamppb.Now(), Delivered: 1}
	b.Run("hand-written", func(b *testing.B) {
		for b.Loop() {
			_, _ = Marshal(ev)
		}
	})
	b.Run("protojson", func(b *testing.B) {
		for b.Loop() {
			_, _ = marshalOptions.Marshal(ev)
		}
	})
}

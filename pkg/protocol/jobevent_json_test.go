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

// randomJobEvent sets most fields of a JobEvent to random values that take
// every branch of the encoders.
func randomJobEvent(t testing.TB, r *rand.Rand) *jetfleetpb.JobEvent {
	t.Helper()
	fields := (&jetfleetpb.JobEvent{}).ProtoReflect().Descriptor().Fields()
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
	return ev
}

// TestJobEventEncoderMatchesProtojson checks the hand-written JobEvent
// encoder against protojson on random events with every field, and that it
// knows every field the schema has.
func TestJobEventEncoderMatchesProtojson(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	fields := (&jetfleetpb.JobEvent{}).ProtoReflect().Descriptor().Fields()
	for i := range 2000 {
		ev := randomJobEvent(t, r)
		m := ev.ProtoReflect()
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

// TestJobEventDecoderMatchesProtojson decodes random events with the
// hand-written decoder and with protojson: where the fast path takes an
// event it must agree, and it must take every event whose strings need no
// escape — the events agents write.
func TestJobEventDecoderMatchesProtojson(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	taken := 0
	for i := range 2000 {
		ev := randomJobEvent(t, r)
		data, err := Marshal(ev)
		require.NoError(t, err)
		var fast jetfleetpb.JobEvent
		if !decodeJobEvent(data, &fast) {
			continue
		}
		taken++
		var slow jetfleetpb.JobEvent
		require.NoError(t, unmarshalOptions.Unmarshal(data, &slow), "event %d: %s", i, data)
		require.True(t, proto.Equal(&slow, &fast), "event %d:\nprotojson %v\nfast      %v\njson %s", i, &slow, &fast, data)
	}
	require.Positive(t, taken)

	typical := &jetfleetpb.JobEvent{Type: "failed", JobId: "order-42", Queue: "default", Kind: "send-email", Attempt: 2,
		MaxAttempts: 5, AgentId: "host-1-42-abc", Time: timestamppb.Now(), Duration: durationpb.New(3 * time.Millisecond),
		Error: "smtp: connection refused (€)", RetryIn: durationpb.New(-1500 * time.Millisecond), NominalTime: timestamppb.New(time.Unix(0, 1)),
		TraceId: "0af7651916cd43dd8448eb211c80319c", StreamSequence: math.MaxUint64, StartedAt: timestamppb.Now(),
		Snoozes: math.MaxUint32, Delivered: 1, Progress: 0.25, Result: []byte("{\"rows\":3}\n")}
	data, err := Marshal(typical)
	require.NoError(t, err)
	var fast jetfleetpb.JobEvent
	require.True(t, decodeJobEvent(data, &fast), "the fast path refused %s", data)
	require.True(t, proto.Equal(typical, &fast), "want %v\ngot  %v", typical, &fast)
}

// FuzzJobEventDecoderAgreesWithProtojson: whatever the fast path accepts,
// protojson accepts with the same result.
func FuzzJobEventDecoderAgreesWithProtojson(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		data, err := Marshal(randomJobEvent(f, r))
		require.NoError(f, err)
		f.Add(data)
	}
	for _, seed := range []string{`{}`, ` { "type" : "succeeded" } `, `{"type":"a","type":"b"}`, `{"jobId":"x"}`,
		`{"attempt":1.0}`, `{"attempt":01}`, `{"stream_sequence":"12"}`, `{"delivered":18446744073709551616}`,
		`{"time":"2026-11-26T10:00:00.1234567890Z"}`, `{"time":"2026-02-30T10:00:00Z"}`, `{"time":"2026-11-26T10:00:00+01:00"}`,
		`{"duration":"-0.5s"}`, `{"duration":"1.s"}`, `{"duration":"315576000001s"}`, `{"progress":-0}`, `{"progress":1e400}`,
		`{"result":"eyJ9"}`, `{"result":"eyJ"}`, `{"result":"-_8="}`, `{"error":null}`, `{"error":"\u00e9"}`, "{\"error\":\"\xff\"}",
		`{"type":"x"} x`, `{"type":"x",}`, `[]`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast jetfleetpb.JobEvent
		if !decodeJobEvent(data, &fast) {
			return
		}
		var slow jetfleetpb.JobEvent
		require.NoError(t, unmarshalOptions.Unmarshal(data, &slow), "the fast path took %q", data)
		require.True(t, proto.Equal(&slow, &fast), "%q:\nprotojson %v\nfast      %v", data, &slow, &fast)
	})
}

func BenchmarkUnmarshalJobEvent(b *testing.B) {
	data, err := Marshal(&jetfleetpb.JobEvent{Type: "succeeded", JobId: "order-42", Queue: "default", Kind: "send-email",
		Attempt: 1, MaxAttempts: 5, AgentId: "host-1-42-abc", Time: timestamppb.Now(), Duration: durationpb.New(3 * time.Millisecond),
		TraceId: "0af7651916cd43dd8448eb211c80319c", StreamSequence: 12345, StartedAt: timestamppb.Now(), Delivered: 1})
	require.NoError(b, err)
	b.Run("hand-written", func(b *testing.B) {
		for b.Loop() {
			var ev jetfleetpb.JobEvent
			_ = Unmarshal(data, &ev)
		}
	})
	b.Run("protojson", func(b *testing.B) {
		for b.Loop() {
			var ev jetfleetpb.JobEvent
			_ = unmarshalOptions.Unmarshal(data, &ev)
		}
	})
}

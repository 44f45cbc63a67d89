package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWorkflowYAMLToJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml, want, err string
	}{
		{name: "map and list", yaml: "name: nightly\nsteps:\n  - name: list\n    kind: echo\n", want: `{"name":"nightly","steps":[{"name":"list","kind":"echo"}]}`},
		{name: "flow style", yaml: "{a: [1, two], b: {c: null}}", want: `{"a":[1,"two"],"b":{"c":null}}`},
		{name: "integers stay exact", yaml: "small: 42\nneg: -7\nbig: 123456789012345678901234567890\nmax: 18446744073709551616",
			want: `{"small":42,"neg":-7,"big":123456789012345678901234567890,"max":18446744073709551616}`},
		{name: "floats keep their digits", yaml: "a: 0.1000000000000000055511151231257827\nb: 1.50\nc: 6.02e23\nd: -0.0",
			want: `{"a":0.1000000000000000055511151231257827,"b":1.50,"c":6.02e23,"d":-0.0}`},
		{name: "YAML number forms", yaml: "hex: 0x1F\noct: 0o17\nbin: 0b101\nsep: 1_000\nplus: +1.5\nlead: .5\nneglead: -.5\ntrail: 1.\nexp: 1.e3\nzeros: 007.5",
			want: `{"hex":31,"oct":15,"bin":5,"sep":1000,"plus":1.5,"lead":0.5,"neglead":-0.5,"trail":1,"exp":1e3,"zeros":7.5}`},
		{name: "scalars", yaml: "t: true\nf: False\nn: ~\ne:\ns: 'x'\nq: \"007\"", want: `{"t":true,"f":false,"n":null,"e":null,"s":"x","q":"007"}`},
		{name: "YAML 1.1 words are strings", yaml: "on: yes\noff: no", want: `{"on":"yes","off":"no"}`},
		{name: "a timestamp stays as written", yaml: "day: 2026-01-02\nat: 2026-01-02T15:04:05Z", want: `{"day":"2026-01-02","at":"2026-01-02T15:04:05Z"}`},
		{name: "templates and HTML characters", yaml: `input: {file: "{{item}}", html: "<b>&"}`, want: `{"input":{"file":"{{item}}","html":"\u003cb\u003e\u0026"}}`},
		{name: "multi-line string", yaml: "d: |\n  two\n  lines\n", want: `{"d":"two\nlines\n"}`},
		{name: "explicit string tag", yaml: "a: !!str 12", want: `{"a":"12"}`},
		{name: "aliases", yaml: "x: &x [1, 2]\ny: *x", want: `{"x":[1,2],"y":[1,2]}`},
		{name: "merge keys, own keys win", yaml: "base: &b {attempts: 3, queue: q}\nstep:\n  <<: *b\n  queue: mine\n  name: s",
			want: `{"base":{"attempts":3,"queue":"q"},"step":{"queue":"mine","name":"s","attempts":3}}`},
		{name: "merge of a list, the first wins", yaml: "a: &a {k: 1}\nb: &b {k: 2, l: 2}\nc: {<<: [*a, *b]}",
			want: `{"a":{"k":1},"b":{"k":2,"l":2},"c":{"k":1,"l":2}}`},
		{name: "a document marker", yaml: "---\na: 1\n", want: `{"a":1}`},
		{name: "a list at the top", yaml: "- 1\n- b", want: `[1,"b"]`},

		{name: "an integer key", yaml: "steps:\n  1: a", err: "line 2, column 3: a map key must be a string, got 1 (int): quote it"},
		{name: "a boolean key", yaml: "true: a", err: "line 1, column 1: a map key must be a string, got true (bool)"},
		{name: "a null key", yaml: "~: a", err: "a map key must be a string, got ~ (null)"},
		{name: "a list key", yaml: "? [a]\n: b", err: "line 1, column 3: a map key must be a string, not a list or a map"},
		{name: "a duplicate key", yaml: "a: 1\nb: 2\na: 3", err: `line 3: key "a" is given twice (first on line 1)`},
		{name: "infinity", yaml: "a: .inf", err: "line 1: .inf is not a number JSON can hold"},
		{name: "not a number", yaml: "a: .NaN", err: "line 1: .NaN is not a number JSON can hold"},
		{name: "an unknown tag", yaml: "a: !env HOME", err: "line 1: the YAML tag !env has no JSON equivalent"},
		{name: "a bad merge", yaml: "a: {<<: 1}", err: "line 1: a merge key (<<) takes a map or a list of maps"},
		{name: "an alias inside its own anchor", yaml: "a: &a\n  b: *a\n", err: "line 2: an alias refers to a map or list that contains it"},
		{name: "a list inside itself", yaml: "&l [1, *l]", err: "line 1: an alias refers to a map or list that contains it"},
		{name: "a map merged into itself", yaml: "a: &a {k: 1, <<: *a}", err: "line 1: an alias refers to a map or list that contains it"},
		{name: "a syntax error", yaml: "a: 1\n b: 2\n", err: "invalid YAML: line 2: mapping values are not allowed in this context"},
		{name: "an unclosed quote", yaml: "a: \"x\nb: 2", err: "invalid YAML: line 2: found unexpected end of stream"},
		{name: "two documents", yaml: "a: 1\n---\nb: 2\n", err: "line 2: more than one YAML document (---)"},
		{name: "only a comment", yaml: "# nothing\n", err: "holds no YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := documentJSON("flow.yaml", []byte(tc.yaml))
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				assert.True(t, strings.HasPrefix(err.Error(), "flow.yaml"), "the error names the file: %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
			assert.True(t, json.Valid(got))
		})
	}
}

func TestWorkflowYAMLAliasesAreBounded(t *testing.T) {
	t.Parallel()
	// A "billion laughs" document: each level doubles ten times over.
	var b strings.Builder
	b.WriteString("a0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n")
	for i := 1; i < 9; i++ {
		refs := strings.Repeat("*a"+string(rune('0'+i-1))+", ", 9) + "*a" + string(rune('0'+i-1))
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + refs + "]\n")
	}
	_, err := documentJSON("laughs.yml", []byte(b.String()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "expands to more than 16 MiB")
}

func TestWorkflowDocumentFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, data, want, err string
	}{
		{name: "JSON by extension", file: "flow.json", data: "{\n  \"name\": \"x\",\n  \"n\": 1.50\n}\n", want: `{"name":"x","n":1.50}`},
		{name: "YAML by extension", file: "flow.yml", data: "name: x", want: `{"name":"x"}`},
		{name: "YAML by extension, upper case", file: "FLOW.YAML", data: "name: x", want: `{"name":"x"}`},
		{name: "JSON by content", file: "standard input", data: ` {"name": "x"}`, want: `{"name":"x"}`},
		{name: "YAML by content", file: "standard input", data: "name: x\n", want: `{"name":"x"}`},
		{name: "YAML flow style by content", file: "flow.txt", data: "{name: x}", want: `{"name":"x"}`},
		{name: "a JSON list by content", file: "standard input", data: `[1, 2]`, want: `[1,2]`},

		{name: "JSON with a mistake", file: "flow.json", data: "{\n  \"name\": \"x\",\n}\n",
			err: "flow.json: invalid JSON: line 3, column 1: invalid character '}' looking for beginning of object key string"},
		{name: "JSON cut short", file: "flow.json", data: "{\"name\": ", err: "flow.json: invalid JSON: line 1, column 10: unexpected end of the document"},
		{name: "two JSON values", file: "flow.json", data: "{}\n{}", err: "flow.json: invalid JSON: line 2, column 1: more than one JSON value"},
		{name: "JSON by content with a mistake", file: "standard input", data: "{\"name\": \"x\",, }",
			err: "standard input: invalid JSON: line 1, column 14: invalid character ','"},
		{name: "YAML in a .json file", file: "flow.json", data: "name: x", err: "flow.json: invalid JSON: line 1, column 2: invalid character 'a'"},
		{name: "empty", file: "flow.yaml", data: " \n", err: "flow.yaml is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := documentJSON(tc.file, []byte(tc.data))
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

// FuzzWorkflowDocument: whatever the input, documentJSON does not panic,
// and what it accepts is one valid JSON value.
func FuzzWorkflowDocument(f *testing.F) {
	for _, seed := range []string{"name: x\nsteps: [{name: a, kind: echo}]", `{"name": "x"}`, "a: &a {k: 1}\nb: {<<: *a}",
		"n: 0x1F\nf: -.5e3\nbig: 123456789012345678901234567890", "1: a", "- !!binary aGk=\n- 2026-01-02", "a: .inf", "{a: [1, 2}"} {
		f.Add("flow.yaml", []byte(seed))
		f.Add("standard input", []byte(seed))
	}
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		doc, err := documentJSON(name, data)
		if err == nil {
			assert.True(t, json.Valid(doc), "%q gave %s", data, doc)
		}
	})
}

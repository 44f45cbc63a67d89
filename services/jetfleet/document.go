package main

// JSON or YAML documents read from a file or standard input: workflow
// definitions (workflow add -f) and run inputs (workflow run -input-file).
// YAML is converted to JSON node by node, so that numbers keep their digits.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// readDocument reads the JSON or YAML document of the flag -flagName (a file, or
// standard input for "-") and returns it as JSON.
func readDocument(inv *invocation, flagName, path string) ([]byte, error) {
	name := path
	var data []byte
	var err error
	if path == "-" {
		name = "standard input"
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: -%s: %w", inv.cmd.path(), flagName, err)
	}
	doc, err := documentJSON(name, data)
	if err != nil {
		return nil, fmt.Errorf("%s: -%s: %w", inv.cmd.path(), flagName, err)
	}
	return doc, nil
}

// documentJSON returns the document data read from name as JSON: a name
// ending in .yaml or .yml is YAML, one ending in .json is JSON; any other
// (standard input) is JSON when it starts with '{' or '[' and is valid
// JSON, and YAML else. Errors name the document and, when known, the line.
func documentJSON(name string, data []byte) ([]byte, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%s is empty", name)
	}
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return yamlDocument(name, data)
	case ".json":
		return jsonDocument(name, data)
	}
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); trimmed[0] == '{' || trimmed[0] == '[' {
		doc, err := jsonDocument(name, data)
		if err == nil {
			return doc, nil
		}
		if ydoc, yerr := yamlDocument(name, data); yerr == nil {
			return ydoc, nil // YAML in flow style
		}
		return nil, err // most likely JSON with a mistake
	}
	return yamlDocument(name, data)
}

// jsonDocument checks that data holds exactly one JSON value and returns it
// compacted.
func jsonDocument(name string, data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	var doc json.RawMessage
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %s", name, jsonErrorAt(data, err))
	}
	if rest := bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		line, col := lineColumn(data, int64(len(data)-len(rest)))
		return nil, fmt.Errorf("%s: invalid JSON: line %d, column %d: more than one JSON value", name, line, col)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, doc); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", name, err)
	}
	return b.Bytes(), nil
}

// jsonErrorAt says where in data a decoding error is.
func jsonErrorAt(data []byte, err error) string {
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &syntax):
		line, col := lineColumn(data, syntax.Offset-1) // the byte it could not read
		return fmt.Sprintf("line %d, column %d: %v", line, col, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		line, col := lineColumn(data, int64(len(data)))
		return fmt.Sprintf("line %d, column %d: unexpected end of the document", line, col)
	}
	return err.Error()
}

// lineColumn returns the 1-based line and column of the byte at offset
// (len(data): just past the end).
func lineColumn(data []byte, offset int64) (line, col int) {
	offset = min(max(offset, 0), int64(len(data)))
	before := data[:offset]
	line = bytes.Count(before, []byte{'\n'}) + 1
	col = int(offset) - (bytes.LastIndexByte(before, '\n') + 1) + 1
	return line, col
}

// maxYAMLExpansion bounds the JSON a YAML document expands to through its
// aliases (a "billion laughs" document stops there).
const maxYAMLExpansion = 16 << 20

// yamlDocument converts one YAML document to JSON. Numbers keep the digits
// they were written with; map keys must be strings; aliases and merge keys
// (<<) are expanded.
func yamlDocument(name string, data []byte) ([]byte, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s holds no YAML document", name)
		}
		return nil, fmt.Errorf("%s: invalid YAML: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("%s: invalid YAML: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
		}
		return nil, fmt.Errorf("%s: line %d: more than one YAML document (---)", name, extra.Line)
	}
	c := yamlConverter{open: map[*yaml.Node]bool{}}
	if err := c.write(&doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c.b.Bytes(), nil
}

// yamlConverter writes YAML nodes as JSON.
type yamlConverter struct {
	b bytes.Buffer
	// open holds the maps and lists being written: an alias to one of them
	// (legal in YAML) would never end.
	open map[*yaml.Node]bool
}

// enter marks the map or list n open until the returned func is called.
func (c *yamlConverter) enter(n *yaml.Node, alias *yaml.Node) (func(), error) {
	if c.open[n] {
		line := n.Line
		if alias != nil {
			line = alias.Line
		}
		return nil, fmt.Errorf("line %d: an alias refers to a map or list that contains it", line)
	}
	c.open[n] = true
	return func() { delete(c.open, n) }, nil
}

func (c *yamlConverter) write(n *yaml.Node) error {
	return c.writeVia(n, nil)
}

// writeVia writes n, reached through alias (nil when it was not).
func (c *yamlConverter) writeVia(n, alias *yaml.Node) error {
	b := &c.b
	if b.Len() > maxYAMLExpansion {
		return fmt.Errorf("line %d: the document expands to more than %d MiB of JSON (aliases)", n.Line, maxYAMLExpansion>>20)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			b.WriteString("null")
			return nil
		}
		return c.write(n.Content[0])
	case yaml.AliasNode:
		return c.writeVia(n.Alias, n)
	case yaml.SequenceNode:
		leave, err := c.enter(n, alias)
		if err != nil {
			return err
		}
		defer leave()
		b.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := c.write(item); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	case yaml.MappingNode:
		leave, err := c.enter(n, alias)
		if err != nil {
			return err
		}
		defer leave()
		pairs, err := c.pairs(n)
		if err != nil {
			return err
		}
		b.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				b.WriteByte(',')
			}
			key, _ := json.Marshal(p.key) // a string always encodes
			b.Write(key)
			b.WriteByte(':')
			if err := c.write(p.value); err != nil {
				return err
			}
		}
		b.WriteByte('}')
		return nil
	case yaml.ScalarNode:
		return writeYAMLScalar(b, n)
	}
	return fmt.Errorf("line %d: unexpected YAML node", n.Line)
}

type yamlPair struct {
	key   string
	value *yaml.Node
}

// pairs returns a mapping's keys and values in order, the keys of its
// merge keys (<<) after its own; a key of its own wins over a merged one,
// an earlier merged map over a later.
func (c *yamlConverter) pairs(n *yaml.Node) ([]yamlPair, error) {
	var own, merged []yamlPair
	where := map[string]int{} // line of each key of its own
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolveAlias(n.Content[i]), n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		key, err := yamlKey(k)
		if err != nil {
			return nil, err
		}
		if line, dup := where[key]; dup {
			return nil, fmt.Errorf("line %d: key %q is given twice (first on line %d)", k.Line, key, line)
		}
		where[key] = k.Line
		own = append(own, yamlPair{key, v})
	}
	seen := map[string]bool{}
	var add func(m *yaml.Node) error
	add = func(via *yaml.Node) error {
		m := resolveAlias(via)
		switch m.Kind {
		case yaml.MappingNode:
			leave, err := c.enter(m, via)
			if err != nil {
				return err
			}
			defer leave()
			pairs, err := c.pairs(m)
			if err != nil {
				return err
			}
			for _, p := range pairs {
				if _, isOwn := where[p.key]; !isOwn && !seen[p.key] {
					seen[p.key] = true
					merged = append(merged, p)
				}
			}
			return nil
		case yaml.SequenceNode:
			for _, item := range m.Content {
				if resolveAlias(item).Kind != yaml.MappingNode {
					return fmt.Errorf("line %d: a merge key (<<) takes a map or a list of maps", item.Line)
				}
				if err := add(item); err != nil {
					return err
				}
			}
			return nil
		}
		return fmt.Errorf("line %d: a merge key (<<) takes a map or a list of maps", via.Line)
	}
	for _, m := range merges {
		if err := add(m); err != nil {
			return nil, err
		}
	}
	return append(own, merged...), nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// yamlKey returns a map key, which must be a string (JSON has no other).
func yamlKey(k *yaml.Node) (string, error) {
	if k.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d, column %d: a map key must be a string, not a list or a map", k.Line, k.Column)
	}
	if tag := k.ShortTag(); tag != "!!str" {
		return "", fmt.Errorf("line %d, column %d: a map key must be a string, got %s (%s): quote it", k.Line, k.Column,
			k.Value, strings.TrimPrefix(tag, "!!"))
	}
	return k.Value, nil
}

// jsonNumber is the grammar of a JSON number.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

// yamlDecimal is a YAML float written in decimal: sign, integer digits,
// fraction, exponent.
var yamlDecimal = regexp.MustCompile(`^([-+]?)([0-9]*)(?:\.([0-9]*))?([eE][-+]?[0-9]+)?$`)

func writeYAMLScalar(b *bytes.Buffer, n *yaml.Node) error {
	switch tag := n.ShortTag(); tag {
	case "!!null":
		b.WriteString("null")
	case "!!bool":
		var v bool
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %q is not a boolean", n.Line, n.Value)
		}
		fmt.Fprint(b, v)
	case "!!int":
		var v big.Int
		if _, ok := v.SetString(strings.ReplaceAll(n.Value, "_", ""), 0); !ok {
			return fmt.Errorf("line %d: %q is not an integer", n.Line, n.Value)
		}
		b.WriteString(v.String())
	case "!!float":
		num, err := yamlFloat(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b.WriteString(num)
	case "!!str", "!!timestamp", "!!binary":
		// A timestamp stays the text it was written as; binary stays base64.
		s, _ := json.Marshal(n.Value) // a string always encodes
		b.Write(s)
	default:
		return fmt.Errorf("line %d: the YAML tag %s has no JSON equivalent", n.Line, tag)
	}
	return nil
}

// yamlFloat returns a YAML float as a JSON number with the same digits.
func yamlFloat(s string) (string, error) {
	plain := strings.ReplaceAll(s, "_", "")
	if jsonNumber.MatchString(plain) {
		return plain, nil
	}
	m := yamlDecimal.FindStringSubmatch(plain)
	if m == nil || m[2]+m[3] == "" {
		return "", fmt.Errorf("%s is not a number JSON can hold", s)
	}
	sign, whole, frac, exp := m[1], strings.TrimLeft(m[2], "0"), m[3], m[4]
	if sign == "+" {
		sign = ""
	}
	if whole == "" {
		whole = "0"
	}
	num := sign + whole
	if frac != "" {
		num += "." + frac
	}
	return num + exp, nil
}

package config

import (
	"encoding"
	"fmt"
	"io"
	"reflect"

	yaml "go.yaml.in/yaml/v3"
)

// Redacted replaces the value of secret keys in printed configuration.
const Redacted = "<redacted>"

// Print writes cfg, a configuration struct, as YAML: durations as "30s",
// secret fields (tag `secret:"true"`) as <redacted> when set.
func Print(w io.Writer, cfg any) error {
	tree := toTree(reflect.ValueOf(cfg), false)
	out, err := yaml.Marshal(tree)
	if err != nil {
		return fmt.Errorf("config: print: %w", err)
	}
	_, err = w.Write(out)
	return err
}

func toTree(v reflect.Value, secret bool) any {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if secret {
		if v.IsZero() {
			return ""
		}
		return Redacted
	}
	if v.Type() == durationType {
		return v.Interface().(fmt.Stringer).String()
	}
	if m, ok := v.Interface().(encoding.TextMarshaler); ok {
		text, err := m.MarshalText()
		if err == nil {
			return string(text)
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		out := yaml.Node{Kind: yaml.MappingNode}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name, squash := tagName(f)
			if !f.IsExported() {
				continue
			}
			if squash {
				if inner, ok := toTree(v.Field(i), false).(*yaml.Node); ok {
					out.Content = append(out.Content, inner.Content...)
				}
				continue
			}
			if name == "" || name == "-" {
				continue
			}
			var val yaml.Node
			if err := val.Encode(toTree(v.Field(i), f.Tag.Get("secret") == "true")); err != nil {
				continue
			}
			out.Content = append(out.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name}, &val)
		}
		return &out
	case reflect.Map:
		out := map[string]any{}
		for _, k := range v.MapKeys() {
			out[fmt.Sprint(k.Interface())] = toTree(v.MapIndex(k), false)
		}
		return out
	case reflect.Slice:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = toTree(v.Index(i), false)
		}
		return out
	}
	return v.Interface()
}

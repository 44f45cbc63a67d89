package config

import (
	"encoding"
	"reflect"
	"sort"
	"strings"
	"time"
)

// leaf is one configurable key of a struct: a dotted path whose segments may
// be "*" where the struct holds a map of structs.
type leaf struct {
	path   []string
	typ    reflect.Type
	secret bool
	// isMap: the leaf is itself a map of scalars; keys below it are its entries.
	isMap bool
}

func (l leaf) key() string { return strings.Join(l.path, ".") }

var (
	textUnmarshalerType = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()
	durationType        = reflect.TypeOf(time.Duration(0))
)

// schemaOf lists every leaf of struct type t.
func schemaOf(t reflect.Type) []leaf {
	var out []leaf
	walkSchema(t, nil, false, &out)
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

func isScalar(t reflect.Type) bool {
	if t == durationType || reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return true
	}
	return t.Kind() != reflect.Struct && !(t.Kind() == reflect.Map && t.Elem().Kind() == reflect.Struct)
}

func walkSchema(t reflect.Type, prefix []string, secret bool, out *[]leaf) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, squash := tagName(f)
		if !f.IsExported() || (name == "" && !squash) || name == "-" {
			continue
		}
		fsecret := secret || f.Tag.Get("secret") == "true"
		ft := f.Type
		if squash {
			walkSchema(ft, prefix, fsecret, out)
			continue
		}
		path := append(append([]string(nil), prefix...), name)
		switch {
		case isScalar(ft):
			*out = append(*out, leaf{path: path, typ: ft, secret: fsecret, isMap: ft.Kind() == reflect.Map})
		case ft.Kind() == reflect.Struct:
			walkSchema(ft, path, fsecret, out)
		default: // map of structs
			walkSchema(ft.Elem(), append(path, "*"), fsecret, out)
		}
	}
}

// match finds the leaf a flattened key belongs to.
func match(schema []leaf, key string) (leaf, bool) {
	parts := strings.Split(key, ".")
	for _, l := range schema {
		if l.isMap {
			if len(parts) > len(l.path) && segmentsMatch(l.path, parts[:len(l.path)]) {
				return l, true
			}
			if len(parts) == len(l.path) && segmentsMatch(l.path, parts) {
				return l, true
			}
			continue
		}
		if len(parts) == len(l.path) && segmentsMatch(l.path, parts) {
			return l, true
		}
	}
	return leaf{}, false
}

func segmentsMatch(pattern, parts []string) bool {
	for i, p := range pattern {
		if p != "*" && p != parts[i] {
			return false
		}
	}
	return true
}

// tagName reads a field's koanf tag: its key name, or squash when the tag is
// ",squash" (the field's own keys are lifted into the parent).
func tagName(f reflect.StructField) (name string, squash bool) {
	name, opts, _ := strings.Cut(f.Tag.Get("koanf"), ",")
	return name, opts == "squash"
}

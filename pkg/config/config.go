package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix starts every environment variable that sets a key.
const EnvPrefix = "JETFLEET_"

// Options say where Load reads layers from, in increasing precedence.
type Options struct {
	// Files are YAML files merged in order; later files win.
	Files []string
	// Environ is the environment to read JETFLEET_* variables from. Defaults to os.Environ().
	Environ []string
	// IgnoreEnv lists JETFLEET_* variables that are not configuration keys
	// (for example JETFLEET_CONFIG, read by the caller).
	IgnoreEnv []string
	// Sets are key=value overrides from the command line.
	Sets []string
}

// Validator is implemented by configuration structs that check their values.
type Validator interface {
	Validate() error
}

// KeyError is a problem with the value of one key. Validate methods return
// it (joined with errors.Join when there are several) so Load can say where
// the value came from.
type KeyError struct {
	Key    string
	Source string
	Reason string
}

func (e *KeyError) Error() string {
	if e.Source == "" {
		return fmt.Sprintf("config key %s: %s", e.Key, e.Reason)
	}
	return fmt.Sprintf("config key %s (from %s): %s", e.Key, e.Source, e.Reason)
}

// Invalid builds a *KeyError for Validate methods.
func Invalid(key, format string, args ...any) *KeyError {
	return &KeyError{Key: key, Reason: fmt.Sprintf(format, args...)}
}

// Sources tells which layer set each key.
type Sources struct {
	byKey map[string]string
}

// Of is the layer that set key: "defaults", "file <path>", "env <NAME>" or
// "flag --set <key>". Keys below a map report the source of the entry.
func (s *Sources) Of(key string) string {
	for k := key; k != ""; {
		if src, ok := s.byKey[k]; ok {
			return src
		}
		i := strings.LastIndex(k, ".")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	for k, src := range s.byKey { // a key validated as a parent of set leaves
		if strings.HasPrefix(k, key+".") {
			return src
		}
	}
	return "defaults"
}

type layer struct {
	source string
	k      *koanf.Koanf
	// keySource overrides source per key (environment variables and flags).
	keySource map[string]string
}

// Load overlays files, environment and flags on dst, a pointer to a struct
// that already holds the defaults, then runs dst's Validate method.
func Load(dst any, opts Options) (*Sources, error) {
	rv := reflect.ValueOf(dst)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("config: Load needs a pointer to a struct, got %T", dst)
	}
	schema := schemaOf(rv.Elem().Type())

	var layers []layer
	for _, path := range opts.Files {
		k := koanf.New(".")
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		layers = append(layers, layer{source: "file " + path, k: k})
	}
	envLayer, err := envLayer(schema, opts)
	if err != nil {
		return nil, err
	}
	layers = append(layers, envLayer)
	setLayer, err := setsLayer(opts.Sets)
	if err != nil {
		return nil, err
	}
	layers = append(layers, setLayer)

	sources := &Sources{byKey: map[string]string{}}
	var errs []error
	for _, l := range layers {
		for _, key := range l.k.Keys() {
			src := l.source
			if s, ok := l.keySource[key]; ok {
				src = s
			}
			lf, ok := match(schema, key)
			if !ok {
				errs = append(errs, &KeyError{Key: key, Source: src, Reason: "unknown key" + suggest(schema, key)})
				continue
			}
			if err := decodeValue(l.k.Get(key), lf.typ); err != nil && !lf.isMap {
				errs = append(errs, &KeyError{Key: key, Source: src, Reason: err.Error()})
				continue
			}
			sources.byKey[key] = src
			// An entry of a map of structs comes from the layer that first
			// set one of its keys: so do its keys left unset.
			parts := strings.Split(key, ".")
			for i, seg := range lf.path {
				if entry := strings.Join(parts[:i+1], "."); seg == "*" && sources.byKey[entry] == "" {
					sources.byKey[entry] = src
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	merged := koanf.New(".")
	for _, l := range layers {
		if err := merged.Merge(l.k); err != nil {
			return nil, fmt.Errorf("config: merge %s: %w", l.source, err)
		}
	}
	if err := decode(merged.Raw(), dst); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if v, ok := dst.(Validator); ok {
		if err := v.Validate(); err != nil {
			return sources, annotate(err, sources)
		}
	}
	return sources, nil
}

func envLayer(schema []leaf, opts Options) (layer, error) {
	environ := opts.Environ
	if environ == nil {
		environ = os.Environ()
	}
	byEnv := map[string]leaf{}
	for _, l := range schema {
		if strings.Contains(l.key(), "*") {
			continue
		}
		byEnv[EnvName(l.key())] = l
	}
	ignored := map[string]bool{}
	for _, name := range opts.IgnoreEnv {
		ignored[name] = true
	}
	values := map[string]any{}
	keySource := map[string]string{}
	var errs []error
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) || ignored[name] {
			continue
		}
		l, ok := byEnv[name]
		if !ok {
			errs = append(errs, fmt.Errorf("environment variable %s does not name a config key", name))
			continue
		}
		var v any = value
		if l.typ.Kind() == reflect.Slice && l.typ.Elem().Kind() == reflect.String {
			v = splitList(value)
		}
		values[l.key()] = v
		keySource[l.key()] = "env " + name
	}
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(values, "."), nil); err != nil {
		return layer{}, fmt.Errorf("config: environment: %w", err)
	}
	return layer{source: "env", k: k, keySource: keySource}, errors.Join(errs...)
}

func setsLayer(sets []string) (layer, error) {
	values := map[string]any{}
	keySource := map[string]string{}
	for _, s := range sets {
		key, value, ok := strings.Cut(s, "=")
		if !ok || key == "" {
			return layer{}, fmt.Errorf("flag --set %q: want key=value", s)
		}
		values[key] = value
		keySource[key] = "flag --set " + key
	}
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(values, "."), nil); err != nil {
		return layer{}, fmt.Errorf("config: flags: %w", err)
	}
	return layer{source: "flags", k: k, keySource: keySource}, nil
}

// EnvName is the environment variable that sets key.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return []string{}
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func decoderConfig(result any) *mapstructure.DecoderConfig {
	return &mapstructure.DecoderConfig{
		Result:           result,
		TagName:          "koanf",
		WeaklyTypedInput: true,
		ErrorUnused:      true,
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.TextUnmarshallerHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		),
	}
}

func decode(input, result any) error {
	d, err := mapstructure.NewDecoder(decoderConfig(result))
	if err != nil {
		return err
	}
	return d.Decode(input)
}

// decodeValue checks that v converts to t, with a message a user can act on.
func decodeValue(v any, t reflect.Type) error {
	target := reflect.New(t)
	if err := decode(v, target.Interface()); err != nil {
		return fmt.Errorf("cannot use %#v as %s", v, typeName(t))
	}
	return nil
}

func typeName(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration (for example 30s or 5m)"
	case t.Kind() == reflect.Bool:
		return "a boolean (true or false)"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.Slice:
		return "a list"
	}
	return t.String()
}

func annotate(err error, sources *Sources) error {
	var errs []error
	var walk func(error)
	walk = func(e error) {
		if joined, ok := e.(interface{ Unwrap() []error }); ok {
			for _, inner := range joined.Unwrap() {
				walk(inner)
			}
			return
		}
		var ke *KeyError
		if errors.As(e, &ke) && ke.Source == "" {
			annotated := *ke
			annotated.Source = sources.Of(ke.Key)
			errs = append(errs, &annotated)
			return
		}
		errs = append(errs, e)
	}
	walk(err)
	return errors.Join(errs...)
}

func suggest(schema []leaf, key string) string {
	last := key[strings.LastIndex(key, ".")+1:]
	var near []string
	for _, l := range schema {
		if l.path[len(l.path)-1] == last {
			near = append(near, l.key())
		}
	}
	sort.Strings(near)
	if len(near) == 0 {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", strings.Join(near, " or "))
}

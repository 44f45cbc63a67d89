package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a size in bytes that reads "512", "64KiB", "1MiB", "2GiB"
// (also KB/MB/GB, meaning the same powers of 1024).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	s := strings.TrimSpace(string(text))
	factor := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, factor = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a size such as 512, 64KiB or 1MiB", string(text))
	}
	*b = ByteSize(n * factor)
	return nil
}

// MarshalText implements encoding.TextMarshaler with the largest unit that
// divides the size evenly.
func (b ByteSize) MarshalText() ([]byte, error) {
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.factor == 0 {
			return []byte(fmt.Sprintf("%d%s", int64(b)/u.factor, u.suffix)), nil
		}
	}
	return []byte(strconv.FormatInt(int64(b), 10)), nil
}

// String writes the size as MarshalText does ("512KiB").
func (b ByteSize) String() string {
	text, _ := b.MarshalText()
	return string(text)
}

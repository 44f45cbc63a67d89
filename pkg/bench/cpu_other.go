//go:build !unix

package bench

import "time"

// ProcessCPU is not measured (0) on this platform.
func ProcessCPU() time.Duration { return 0 }

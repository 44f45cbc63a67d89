//go:build !unix

package bench

import "time"

// ProcessCPU is not measured (0) on this platform.
func ProcessCPU() time.Duration { return 0 }

// peakRSS is unknown here.
func peakRSS() int64 { return 0 }

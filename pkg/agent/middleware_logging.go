package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Logging logs the end of every job attempt with job_id, queue, kind,
// attempt, outcome and duration: failures as warnings or errors, everything
// else (and the start) at debug level, so a busy agent logs what needs
// attention. Payloads are never logged: they may hold secrets.
func Logging(logger *slog.Logger) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			debug := logger.Enabled(ctx, slog.LevelDebug)
			if debug {
				logger.DebugContext(ctx, "job started", telemetry.LogJobID, job.ID, telemetry.LogQueue, job.Queue,
					telemetry.LogKind, job.Kind, "delivered", job.Delivered)
			}
			start := time.Now()
			err := next(ctx, job)
			level := slog.LevelDebug
			switch job.Outcome() {
			case protocol.EventRetrying:
				level = slog.LevelWarn
			case protocol.EventFailed, protocol.EventCancelled:
				level = slog.LevelError
			}
			if level == slog.LevelDebug && !debug {
				return err
			}
			attrs := []any{telemetry.LogJobID, job.ID, telemetry.LogQueue, job.Queue, telemetry.LogKind, job.Kind,
				"attempt", job.Attempt, "outcome", job.Outcome(), "duration", time.Since(start).String()}
			if job.ScheduleID != "" {
				attrs = append(attrs, telemetry.LogScheduleID, job.ScheduleID)
			}
			if err != nil {
				attrs = append(attrs, telemetry.LogError, err.Error())
			}
			logger.Log(ctx, level, "job finished", attrs...)
			return err
		}
	}
}

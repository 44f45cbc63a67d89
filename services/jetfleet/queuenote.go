package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// unknownQueueNote is a line for the table output of a command that stored
// something for queue (a schedule's target, a limit), when no such queue
// exists yet: its jobs would be dead-lettered as unroutable until one does.
// Empty when the queue exists, or when the fleet cannot say (no supervisor
// answers): the note is advice, the command has done its work.
func unknownQueueNote(ctx context.Context, api *jetfleet.Client, queue string) string {
	if queue == "" {
		queue = jetfleet.DefaultQueue
	}
	ctx, cancel := context.WithTimeout(ctx, queueNoteTimeout)
	defer cancel()
	res, err := api.Queues(ctx)
	if err != nil {
		return ""
	}
	for _, q := range res.Queues {
		if q.Queue == queue {
			return ""
		}
	}
	return fmt.Sprintf("note: no queue %s exists yet; its jobs are dead-lettered as unroutable until an agent serves it, "+
		"it is declared under topology.queues, or `jetfleet queue add %s` creates it\n", queue, queue)
}

// queueNoteTimeout bounds the look at the queues: the command's output
// waits for it.
const queueNoteTimeout = 2 * time.Second

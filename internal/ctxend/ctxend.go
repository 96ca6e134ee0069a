// Package ctxend tells whether a caller's context has ended, counting a
// deadline that has passed before the context's timer has said so.
package ctxend

import (
	"context"
	"time"
)

// Err returns ctx.Err(), or context.DeadlineExceeded when ctx's deadline
// has passed but its timer has not yet run: a store call cut short at the
// deadline (a driver's "i/o timeout") can return first, most of all on a
// loaded machine, and the caller must still be told that its wait ran out.
func Err(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

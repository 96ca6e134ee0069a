// The order writer: reads the orders stream in a consumer group and writes
// each order to MariaDB, acknowledging it only after the row is committed.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// group is the consumer group of the order writers.
const group = "order-writers"

// schema is the orders table. The order id, the purchase request's
// idempotency key, is the primary key: writing an order a second time (a
// redelivery after a crash between the commit and the XACK) changes
// nothing.
const schema = `CREATE TABLE IF NOT EXISTS orders (
	order_id   VARCHAR(64) NOT NULL PRIMARY KEY,
	user_id    VARCHAR(64) NOT NULL,
	item       VARCHAR(64) NOT NULL,
	stream_id  VARCHAR(32) NOT NULL,
	created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB`

// insertOrder writes an order unless a row with its id exists; its rows
// affected is 1 for a new row and 0 for a copy.
const insertOrder = `INSERT INTO orders (order_id, user_id, item, stream_id) VALUES (?, ?, ?, ?)
	ON DUPLICATE KEY UPDATE order_id = order_id`

// ensureGroup creates the orders stream and its consumer group if missing.
func ensureGroup(ctx context.Context, rdb redis.Cmdable, k keys) error {
	err := rdb.XGroupCreateMkStream(ctx, k.orders(), group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create consumer group: %w", err)
	}
	return nil
}

// writer is one consumer of the group.
type writer struct {
	rdb       *redis.Client
	db        *sql.DB
	k         keys
	consumer  string        // unique per process
	claimIdle time.Duration // take over another consumer's order after it was pending this long
	log       *slog.Logger
}

// run writes orders until ctx ends. It first finishes the orders it was
// given and has not acknowledged (after a store failure), then takes over
// orders that a dead consumer left pending, then reads new ones.
func (w *writer) run(ctx context.Context) {
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	<-backoff.C
	nextClaim := time.Now()
	for ctx.Err() == nil {
		err := w.step(ctx, &nextClaim)
		if err == nil || ctx.Err() != nil {
			continue
		}
		w.log.Warn("flashsale: order writer", "err", err)
		backoff.Reset(200 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-backoff.C:
		}
	}
}

// step handles one batch: own pending orders, else claimed ones, else new.
func (w *writer) step(ctx context.Context, nextClaim *time.Time) error {
	msgs, err := w.read(ctx, "0", -1)
	if err != nil {
		return err
	}
	if len(msgs) == 0 && time.Now().After(*nextClaim) {
		*nextClaim = time.Now().Add(w.claimIdle / 2)
		msgs, _, err = w.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: w.k.orders(), Group: group,
			Consumer: w.consumer, MinIdle: w.claimIdle, Start: "0-0", Count: 100}).Result()
		if err != nil {
			return fmt.Errorf("claim pending orders: %w", err)
		}
	}
	if len(msgs) == 0 {
		if msgs, err = w.read(ctx, ">", 500*time.Millisecond); err != nil {
			return err
		}
	}
	for _, m := range msgs {
		if err := w.write(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// read reads up to 100 entries after id for this consumer, waiting up to
// block for new ones (block < 0: do not wait).
func (w *writer) read(ctx context.Context, id string, block time.Duration) ([]redis.XMessage, error) {
	res, err := w.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: w.consumer,
		Streams: []string{w.k.orders(), id}, Count: 100, Block: block}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	if len(res) == 0 {
		return nil, nil
	}
	return res[0].Messages, nil
}

// write commits the order's row, then acknowledges the entry. A crash
// between the two leaves the entry pending; whoever writes it again finds
// the row and only acknowledges.
func (w *writer) write(ctx context.Context, m redis.XMessage) error {
	id, _ := m.Values["order"].(string)
	user, _ := m.Values["user"].(string)
	item, _ := m.Values["item"].(string)
	if id == "" {
		// An entry that XAUTOCLAIM found deleted, or a malformed one:
		// nothing to write.
		return w.rdb.XAck(ctx, w.k.orders(), group, m.ID).Err()
	}
	res, err := w.db.ExecContext(ctx, insertOrder, id, user, item, m.ID)
	if err != nil {
		return fmt.Errorf("write order %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		// A redelivery: the row was committed before. Count it.
		_ = w.rdb.Incr(ctx, "flashsale:"+w.k.sale+":redelivered").Err()
	}
	if err := w.rdb.XAck(ctx, w.k.orders(), group, m.ID).Err(); err != nil {
		return fmt.Errorf("acknowledge order %s: %w", id, err)
	}
	return nil
}

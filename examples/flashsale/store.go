// The sale's state in Redis: stock per item, a record per purchase request
// (its idempotency key), and the orders stream that feeds MariaDB.

package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed sale.lua
	saleSrc    string
	saleScript = redis.NewScript(saleSrc)

	//go:embed claim.lua
	claimSrc    string
	claimScript = redis.NewScript(claimSrc)

	//go:embed fenced_sale.lua
	fencedSaleSrc    string
	fencedSaleScript = redis.NewScript(fencedSaleSrc)
)

// Answers of a purchase.
const (
	answerOK      = "ok"      // sold: the order is queued
	answerSoldOut = "soldout" // no stock left
	answerStale   = "stale"   // the lock's lease ran out; nothing written
)

// recordTTL is how long a purchase request's record is kept: a copy of the
// request sent again within it gets the first answer.
const recordTTL = 24 * time.Hour

// keys names the sale's keys in Redis. The sale is one flash sale: its
// name prefixes every key.
type keys struct{ sale string }

func (k keys) stock(item string) string      { return "flashsale:" + k.sale + ":stock:" + item }
func (k keys) request(id string) string      { return "flashsale:" + k.sale + ":req:" + id }
func (k keys) orders() string                { return "flashsale:" + k.sale + ":orders" }
func (k keys) lock(item string) string       { return "flashsale:" + k.sale + ":item:" + item }
func (k keys) checkout() string              { return "flashsale:" + k.sale + ":checkout" }
func (k keys) refused() string               { return "flashsale:" + k.sale + ":refused" }
func (k keys) rateLimit(user string) string  { return k.sale + ":user:" + user }
func (k keys) rateWindow(user string) string { return "flashsale:" + k.sale + ":window:" + user }

// order is one purchase: its id is the request's idempotency key.
type order struct {
	ID, User, Item string
}

// sell runs the lock-free sale: check and decrement in one script.
func sell(ctx context.Context, rdb redis.Scripter, k keys, o order) (string, error) {
	ans, err := saleScript.Run(ctx, rdb, []string{k.stock(o.Item), k.request(o.ID), k.orders()},
		o.ID, o.User, o.Item, recordTTL.Milliseconds()).Text()
	if err != nil {
		return "", fmt.Errorf("sell %s: %w", o.Item, err)
	}
	return ans, nil
}

// fenceArg is a fence as the scripts take it: "" for no fence (the
// unfenced variant), which fence 0 is never taken for by mistake.
func fenceArg(fence uint64, unfenced bool) (string, error) {
	switch {
	case unfenced:
		return "", nil
	case fence == 0:
		return "", errors.New("no fence: the lease was not found")
	}
	return strconv.FormatUint(fence, 10), nil
}

// claim is the fenced read under the item's lock: it raises the item's
// fence to fence and returns the stock, or the request's earlier answer
// (done), or answerStale when a newer fence has claimed the item.
func claim(ctx context.Context, rdb redis.Scripter, k keys, o order, fence uint64) (stock int64, done string, err error) {
	arg, err := fenceArg(fence, false)
	if err != nil {
		return 0, "", err
	}
	return claimWith(ctx, rdb, k, o, arg)
}

// claimWith is claim with the fence as the script takes it.
func claimWith(ctx context.Context, rdb redis.Scripter, k keys, o order, fence string) (stock int64, done string, err error) {
	reply, err := claimScript.Run(ctx, rdb, []string{k.stock(o.Item), k.request(o.ID)}, fence).StringSlice()
	if err != nil {
		return 0, "", fmt.Errorf("claim %s: %w", o.Item, err)
	}
	switch {
	case len(reply) == 1 && reply[0] == answerStale:
		return 0, answerStale, nil
	case len(reply) == 2 && reply[0] == "done":
		return 0, reply[1], nil
	case len(reply) == 2 && reply[0] == "stock":
		n, err := strconv.ParseInt(reply[1], 10, 64)
		return n, "", err
	}
	return 0, "", fmt.Errorf("claim %s: unexpected reply %q", o.Item, reply)
}

// fencedSell stores stock as the item's stock and queues the order, in one
// script, unless a newer fence has claimed the item (answerStale, counted
// in the sale's refused key).
func fencedSell(ctx context.Context, rdb redis.Scripter, k keys, o order, fence uint64, stock int64) (string, error) {
	arg, err := fenceArg(fence, false)
	if err != nil {
		return "", err
	}
	return sellWith(ctx, rdb, k, o, arg, stock)
}

// sellWith is fencedSell with the fence as the script takes it.
func sellWith(ctx context.Context, rdb redis.Scripter, k keys, o order, fence string, stock int64) (string, error) {
	ans, err := fencedSaleScript.Run(ctx, rdb, []string{k.stock(o.Item), k.request(o.ID), k.orders(), k.refused()},
		fence, stock, o.ID, o.User, o.Item, recordTTL.Milliseconds()).Text()
	if err != nil {
		return "", fmt.Errorf("fenced sell %s: %w", o.Item, err)
	}
	return ans, nil
}

// stockOf returns the item's stock.
func stockOf(ctx context.Context, rdb redis.Cmdable, k keys, item string) (int64, error) {
	n, err := rdb.HGet(ctx, k.stock(item), "value").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// earlierAnswer returns the answer already given to the request, or "".
func earlierAnswer(ctx context.Context, rdb redis.Cmdable, k keys, id string) (string, error) {
	ans, err := rdb.Get(ctx, k.request(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return ans, err
}

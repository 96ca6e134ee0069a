package chaostest

// The criterion about late requests, checked against the store itself: a
// request that lands after its clean-up must grant nothing and queue
// nothing. A watcher reads, every headsEvery, each name's live exclusive
// holder and the live head of its queue (the entry a grant would serve
// next), directly from the server; afterwards no token whose release or
// withdrawal was answered may show as either.
//
// The history alone cannot tell such a grant or entry for nobody from a
// queue of waiters whose waits are too short for a second request (on a
// slow store a fair waiter that joins behind another gives up before it
// can ask again, and the lock sits free while every waiter is behind
// another waiter that is still there): the store can.

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/locktest/chaos"
	"github.com/dlock-go/dlock/sqllock"
)

// headsEvery is how often the watcher reads the store.
const headsEvery = 20 * time.Millisecond

// sqlGoneTTL is sqllock's goneTTL: how long a clean-up's record refuses
// the token's late requests. A request later than that may grant or queue
// for nobody, as docs/SQL.md says; the check covers the record's life.
const sqlGoneTTL = 5 * time.Second

// headSight is what the store showed of one name at one moment.
type headSight struct {
	at     int64 // chaos.Now() before the store was asked
	name   string
	holder string // token of the live exclusive holder, or ""
	head   string // token of the queue's live head that a grant would serve, or ""
}

// sqlHeads reads every name's live holder and queue head from db, as the
// acquires of sqllock see them: a queue entry of a token whose clean-up is
// recorded is passed over.
func sqlHeads(ctx context.Context, db *sql.DB, d sqllock.Dialect) ([]headSight, error) {
	now := sqlNow[d]
	t := sqllock.DefaultTable
	q := `SELECT m.name, CASE WHEN m.token IS NOT NULL AND m.expires_at > ` + now + ` THEN m.token ELSE '' END,
  COALESCE((SELECT q.token FROM ` + t + `_queue q WHERE q.name = m.name AND q.expires_at > ` + now + `
     AND NOT EXISTS (SELECT 1 FROM ` + t + `_gone g WHERE g.name = q.name AND g.token = q.token AND g.expires_at > ` + now + `)
     ORDER BY q.seq LIMIT 1), '')
FROM ` + t + ` m`
	at := chaos.Now()
	var out []headSight
	err := queryRows(ctx, db, q, func(rows *sql.Rows) error {
		s := headSight{at: at}
		if err := rows.Scan(&s.name, &s.holder, &s.head); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	return out, err
}

// watchHeads reads the store's holders and queue heads (store.heads) every
// headsEvery until ctx ends; the function it returns waits for the watcher
// and returns what it saw. A read that fails is noted in the history and
// retried at the next tick.
func watchHeads(ctx context.Context, r *runState) func() (reads int, sights []headSight) {
	var (
		wg  sync.WaitGroup
		out []headSight
		n   int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(headsEvery)
		defer tick.Stop()
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			got, err := r.store.heads(rctx)
			cancel()
			switch {
			case err == nil:
				n++
				out = append(out, got...)
			case ctx.Err() == nil:
				r.rec.Note("heads watcher: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int, []headSight) {
		wg.Wait()
		return n, out
	}
}

// checkNobody fails the test when the store showed, as a name's holder, a
// token whose release had been answered, or, as its queue's head, a token
// whose release or withdrawal had been answered, within sqlGoneTTL of that
// call's start: a request of the token landed after its clean-up and
// granted or queued for nobody. It reports whether none did.
func checkNobody(t *testing.T, reads int, sights []headSight, events []chaos.Event) bool {
	t.Helper()
	type end struct {
		start, end int64
		release    bool
	}
	ended := make(map[string]end) // token → its first answered release or withdrawal
	for _, e := range events {
		if (e.Kind != chaos.KindStoreRelease && e.Kind != chaos.KindStoreWithdraw) || e.Outcome == chaos.Unknown {
			continue
		}
		if _, ok := ended[e.Token]; !ok || e.End < ended[e.Token].end {
			ended[e.Token] = end{e.Start, e.End, e.Kind == chaos.KindStoreRelease}
		}
	}
	var bad []string
	var t0 int64
	for _, e := range events {
		if t0 == 0 || e.Start < t0 {
			t0 = e.Start
		}
	}
	at := func(ns int64) string { return time.Duration(ns - t0).Round(time.Microsecond).String() }
	for _, s := range sights {
		for _, c := range []struct {
			token, what string
		}{{s.holder, "held by"}, {s.head, "queue headed by"}} {
			e, ok := ended[c.token]
			if c.token == "" || !ok || s.at <= e.end || s.at >= e.start+int64(sqlGoneTTL) {
				continue
			}
			if c.what == "held by" && !e.release {
				continue // a withdrawal leaves holds alone
			}
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("%s %s token %s at %s, after its clean-up was answered at %s",
					s.name, c.what, c.token, at(s.at), at(e.end)))
			}
		}
	}
	t.Logf("holders and queue heads read from the store %d times", reads)
	if reads == 0 {
		t.Errorf("the store's holders and queue heads could not be read once")
		return false
	}
	if len(bad) > 0 {
		t.Errorf("a request that landed after its clean-up granted or queued for nobody: %q", bad)
		return false
	}
	return true
}

package main

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// The run's checker: each count means one fault and fires for it alone.
// A clean state counts nothing; each mutation of it (one fault made by
// hand in Redis and MariaDB) must raise its own count to 1 and no other.
func TestCheckerCounts(t *testing.T) {
	rs := testserver.StartRedis(t)
	maria := testserver.StartMariaDB(t)
	rdb := rs.Client(t)

	// state is a sale of one item of 3 units, as the stores and the
	// clients left it.
	type state struct {
		left      int64    // units left in Redis
		stream    []string // order ids in the orders stream
		rows      []string // order ids with a row
		confirmed []string // told "ok"
		refused   []string // told "soldout" or rate-limited
	}
	clean := state{left: 1, stream: []string{"o1", "o2"}, rows: []string{"o1", "o2"},
		confirmed: []string{"o1", "o2"}, refused: []string{"o3"}}
	cases := []struct {
		name  string
		count string // the count the fault must raise; name when ""
		state state
	}{
		{"clean", "", clean},
		{"oversold", "", state{left: 1, stream: []string{"o1", "o2", "o4"}, rows: []string{"o1", "o2", "o4"},
			confirmed: []string{"o1", "o2", "o4"}, refused: []string{"o3"}}},
		// Four units sold of three, each with its row: the stock went
		// below zero (a sale that decremented without checking).
		{"oversold-below-zero", "oversold", state{left: -1, stream: []string{"o1", "o2", "o4", "o5"},
			rows: []string{"o1", "o2", "o4", "o5"}, confirmed: []string{"o1", "o2", "o4", "o5"}, refused: []string{"o3"}}},
		{"leaked", "", state{left: 0, stream: []string{"o1", "o2"}, rows: []string{"o1", "o2"},
			confirmed: []string{"o1", "o2"}, refused: []string{"o3"}}},
		{"lost", "", state{left: 1, stream: []string{"o1", "o2"}, rows: []string{"o1", "o2"},
			confirmed: []string{"o1", "o2", "o5"}, refused: []string{"o3"}}},
		{"phantom", "", state{left: 0, stream: []string{"o1", "o2", "o3"}, rows: []string{"o1", "o2", "o3"},
			confirmed: []string{"o1", "o2"}, refused: []string{"o3"}}},
		{"duplicated", "", state{left: 1, stream: []string{"o1", "o2", "o2"}, rows: []string{"o1", "o2"},
			confirmed: []string{"o1", "o2"}, refused: []string{"o3"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := "check_" + strings.ReplaceAll(c.name, "-", "_")
			maria.CreateDatabase(t, db)
			cfg := runConfig{items: 1, stock: 3, service: serviceConfig{sale: "check-" + c.name}}
			r := &run{cfg: cfg, k: keys{sale: cfg.service.sale}, rdb: rdb,
				confirmedIDs: c.state.confirmed, refusedIDs: c.state.refused}
			sqlDB, err := sql.Open("mysql", maria.DSN(db))
			if err != nil {
				t.Fatal(err)
			}
			defer sqlDB.Close()
			r.db = sqlDB
			if err := r.setup(ctx); err != nil {
				t.Fatal(err)
			}
			item := itemName(0)
			if err := rdb.HSet(ctx, r.k.stock(item), "value", c.state.left).Err(); err != nil {
				t.Fatal(err)
			}
			for _, id := range c.state.stream {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.k.orders(), Values: []any{"order", id, "user", "u", "item", item}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range c.state.rows {
				if _, err := sqlDB.ExecContext(ctx, insertOrder, id, "u", item, "0-1"); err != nil {
					t.Fatal(err)
				}
			}
			rep := &report{}
			if err := r.check(ctx, rep); err != nil {
				t.Fatal(err)
			}
			all := map[string]int64{"oversold": rep.Oversold, "leaked": rep.Leaked, "lost": rep.Lost,
				"phantom": rep.Phantom, "duplicated": rep.Duplicated}
			for name, n := range all {
				want := int64(0)
				if name == c.name || name == c.count {
					want = 1
				}
				if n != want {
					t.Errorf("%s: %d, want %d (report %+v)", name, n, want, *rep)
				}
			}
			if c.name == "clean" && !rep.ok() {
				t.Errorf("clean state not ok: %+v", *rep)
			}
		})
	}
}

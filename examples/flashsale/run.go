// The sale run: set up the stores, start the service processes, drive the
// load through them, inject faults, wait for the orders to reach MariaDB
// and check the invariants.

package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// runConfig describes one run.
type runConfig struct {
	redisAddr string
	mysqlDSN  string
	service   serviceConfig
	procs     int // service processes

	items       int   // items on sale
	stock       int64 // units of each item
	users       int
	requests    int // purchase requests, in all
	concurrency int // requests in flight at once

	claimIdle time.Duration

	// spawn returns the command that runs one service process with args
	// (the arguments of `flashsale serve`).
	spawn func(args []string) *exec.Cmd
	// faults are run when the given share of the requests has been
	// answered, one after the other, while the load goes on.
	faults []fault
	logf   func(format string, args ...any)
}

// fault is one fault injected during the load.
type fault struct {
	at   float64 // share of the requests answered, 0 to 1
	name string
	do   func(r *run) error
}

// report is what a run measured.
type report struct {
	Strategy   string
	Requests   int
	Elapsed    time.Duration
	Throughput float64 // answered requests per second
	P50, P99   time.Duration
	Sold       int64 // units taken from the stock (Redis)
	Confirmed  int   // "ok" answers the clients received
	SoldOut    int
	Limited    int // 429 answers
	Failed     int // requests that got no answer after all retries
	Retries    int // requests sent again (after a 503 or a broken connection)

	// The invariants: each counts one kind of fault, and must be 0.
	Rows        int64 // order rows in MariaDB
	Oversold    int64 // per item, order rows beyond the units taken from its stock, and units taken beyond the stock (it went below 0)
	Leaked      int64 // per item, units taken from its stock without an order row
	Lost        int64 // requests answered "ok" without an order row
	Phantom     int64 // order rows for requests answered "soldout" or rate-limited
	Duplicated  int64 // stream entries beyond the distinct orders in the stream
	Refused     int64 // late writes the fence refused (mutex): not a fault
	Redelivered int64 // orders written again after a redelivery (changed nothing)
	Faults      []string
}

// run is a run in progress.
type run struct {
	cfg   runConfig
	k     keys
	rdb   *redis.Client
	db    *sql.DB
	procs []*proc

	confirmedIDs []string // orders the clients were told were sold
	refusedIDs   []string // requests the clients were told were not (sold out, rate-limited)
}

// proc is one service process.
type proc struct {
	name string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// runSale runs the sale and returns its report. The error is for a run that
// could not be made; a run whose invariants failed returns its report with
// nonzero Oversold, Lost or Duplicated.
func runSale(ctx context.Context, cfg runConfig) (*report, error) {
	if cfg.logf == nil {
		cfg.logf = func(string, ...any) {}
	}
	r := &run{cfg: cfg, k: keys{sale: cfg.service.sale}}
	r.rdb = redis.NewClient(&redis.Options{Addr: cfg.redisAddr, ContextTimeoutEnabled: true, DialTimeout: time.Second})
	defer r.rdb.Close()
	db, err := sql.Open("mysql", cfg.mysqlDSN)
	if err != nil {
		return nil, err
	}
	r.db = db
	defer db.Close()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	defer r.stopAll()
	for i := range cfg.procs {
		p := &proc{name: fmt.Sprintf("svc-%d", i), addr: "127.0.0.1:0"}
		if err := r.start(p); err != nil {
			return nil, err
		}
		r.procs = append(r.procs, p)
	}

	rep := &report{Strategy: cfg.service.strategy, Requests: cfg.requests}
	if err := r.load(ctx, rep); err != nil {
		return nil, err
	}
	if err := r.drain(ctx); err != nil {
		return rep, err
	}
	return rep, r.check(ctx, rep)
}

// setup creates the table and the consumer group and puts the stock in.
func (r *run) setup(ctx context.Context) error {
	if _, err := r.db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	var n int
	if err := r.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders").Scan(&n); err != nil {
		return err
	}
	if n != 0 {
		// The run owns the database it is given: start from no orders.
		if _, err := r.db.ExecContext(ctx, "TRUNCATE TABLE orders"); err != nil {
			return fmt.Errorf("empty the orders table: %w", err)
		}
	}
	if ex, err := r.rdb.Exists(ctx, r.k.orders()).Result(); err != nil || ex != 0 {
		return fmt.Errorf("the sale %q exists in Redis (or Redis failed: %v): use another -sale", r.k.sale, err)
	}
	for i := range r.cfg.items {
		if err := r.rdb.HSet(ctx, r.k.stock(itemName(i)), "value", r.cfg.stock).Err(); err != nil {
			return err
		}
	}
	return ensureGroup(ctx, r.rdb, r.k)
}

func itemName(i int) string { return fmt.Sprintf("item-%d", i) }

// start starts p on p.addr and waits until it listens; p.addr is then its
// real address (a restart reuses it).
func (r *run) start(p *proc) error {
	c := r.cfg.service
	args := []string{
		"-addr", p.addr, "-redis", r.cfg.redisAddr, "-mysql", r.cfg.mysqlDSN, "-name", p.name,
		"-sale", c.sale, "-strategy", c.strategy, "-rate", strconv.Itoa(c.ratePerMinute),
		"-lock-ttl", c.lockTTL.String(), "-lock-wait", c.lockWait.String(),
		"-permits", strconv.Itoa(c.permits), "-checkout-delay", c.checkoutDelay.String(),
		"-claim-idle", r.cfg.claimIdle.String(),
	}
	if c.limiter != "" {
		args = append(args, "-limiter", c.limiter)
	}
	if c.fair {
		args = append(args, "-fair")
	}
	if c.unfenced {
		args = append(args, "-unfenced")
	}
	cmd := r.cfg.spawn(args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	lines := bufio.NewScanner(out)
	ready := make(chan string, 1)
	go func() {
		defer close(p.done)
		defer func() { _ = cmd.Wait() }()
		for lines.Scan() {
			if addr, ok := strings.CutPrefix(lines.Text(), "listening "); ok {
				select {
				case ready <- addr:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case p.addr = <-ready:
		return nil
	case <-p.done:
		return fmt.Errorf("%s exited before it listened", p.name)
	case <-t.C:
		return fmt.Errorf("%s did not listen within 30s", p.name)
	}
}

// kill9 kills p with SIGKILL, as a crash would, and starts it again on
// the same address.
func (r *run) kill9(i int) error {
	p := r.procs[i]
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return r.start(p)
}

// stopAll stops every process with SIGTERM and waits for them.
func (r *run) stopAll() {
	for _, p := range r.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range r.procs {
		t := time.NewTimer(10 * time.Second)
		select {
		case <-p.done:
		case <-t.C:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		t.Stop()
	}
}

// drain waits until every order in the stream has been acknowledged.
func (r *run) drain(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		left, err := r.unacked(ctx)
		if err == nil && left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("orders not acknowledged 60s after the load: %d (%v)", left, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// unacked returns how many orders are not yet delivered or not yet
// acknowledged. It counts the entries after the group's last delivered
// one rather than trusting XINFO GROUPS' lag: after Redis 7.0 reloads a
// stream from its AOF it reports the group's entries-read and lag as
// unknown (nil), and a run that trusted the lag waited for a count of
// thousands that never went down.
func (r *run) unacked(ctx context.Context) (int64, error) {
	groups, err := r.rdb.XInfoGroups(ctx, r.k.orders()).Result()
	if err != nil {
		return -1, err
	}
	for _, g := range groups {
		if g.Name != group {
			continue
		}
		n := g.Pending
		for after := g.LastDeliveredID; ; {
			msgs, err := r.rdb.XRangeN(ctx, r.k.orders(), "("+after, "+", 1000).Result()
			if err != nil {
				return -1, err
			}
			n += int64(len(msgs))
			if len(msgs) < 1000 {
				return n, nil
			}
			after = msgs[len(msgs)-1].ID
		}
	}
	return -1, errors.New("consumer group missing")
}

// progress returns the units sold so far and the orders not yet
// acknowledged.
func (r *run) progress(ctx context.Context) (sold, queued int64, err error) {
	for i := range r.cfg.items {
		left, err := stockOf(ctx, r.rdb, r.k, itemName(i))
		if err != nil {
			return 0, 0, err
		}
		sold += r.cfg.stock - left
	}
	queued, err = r.unacked(ctx)
	return sold, queued, err
}

// check fills in the invariants of the report (see report: each count
// means one thing, and Sold is the units taken from the stock).
func (r *run) check(ctx context.Context, rep *report) error {
	taken := map[string]int64{}
	for i := range r.cfg.items {
		item := itemName(i)
		left, err := stockOf(ctx, r.rdb, r.k, item)
		if err != nil {
			return err
		}
		taken[item] = r.cfg.stock - left
		rep.Sold += r.cfg.stock - left
		// Units taken beyond the stock: sold, each with its row perhaps,
		// but never there to sell.
		rep.Oversold += max(-left, 0)
	}
	rows := map[string]string{} // order id -> item
	perItem := map[string]int64{}
	q, err := r.db.QueryContext(ctx, "SELECT order_id, item FROM orders")
	if err != nil {
		return err
	}
	for q.Next() {
		var id, item string
		if err := q.Scan(&id, &item); err != nil {
			_ = q.Close()
			return err
		}
		rows[id] = item
		perItem[item]++
	}
	if err := q.Close(); err != nil {
		return err
	}
	rep.Rows = int64(len(rows))
	for item := range merged(taken, perItem) {
		if d := perItem[item] - taken[item]; d > 0 {
			rep.Oversold += d
		} else {
			rep.Leaked += -d
		}
	}
	for _, id := range r.confirmedIDs {
		if _, ok := rows[id]; !ok {
			rep.Lost++
		}
	}
	for _, id := range r.refusedIDs {
		if _, ok := rows[id]; ok {
			rep.Phantom++
		}
	}
	entries, distinct, err := r.streamOrders(ctx)
	if err != nil {
		return err
	}
	rep.Duplicated = entries - distinct
	rep.Refused, _ = r.rdb.Get(ctx, r.k.refused()).Int64()
	rep.Redelivered, _ = r.rdb.Get(ctx, "flashsale:"+r.k.sale+":redelivered").Int64()
	return nil
}

// merged returns the keys of a and b.
func merged(a, b map[string]int64) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// streamOrders counts the orders stream's entries and the distinct order
// ids among them.
func (r *run) streamOrders(ctx context.Context) (entries, distinct int64, err error) {
	ids := map[string]bool{}
	for after := "-"; ; {
		msgs, err := r.rdb.XRangeN(ctx, r.k.orders(), after, "+", 1000).Result()
		if err != nil {
			return 0, 0, err
		}
		for _, m := range msgs {
			id, _ := m.Values["order"].(string)
			ids[id] = true
		}
		entries += int64(len(msgs))
		if len(msgs) < 1000 {
			return entries, int64(len(ids)), nil
		}
		after = "(" + msgs[len(msgs)-1].ID
	}
}

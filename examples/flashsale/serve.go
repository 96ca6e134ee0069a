// One service process: the HTTP service and an order writer.

package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// serveMain runs one service process with the arguments args (as
// `flashsale serve ARGS`) until SIGTERM or SIGINT, and returns its exit
// code. It prints "listening ADDR" on stdout once it accepts requests.
func serveMain(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg serviceConfig
	addr := fs.String("addr", "127.0.0.1:0", "HTTP listen address")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address")
	mysqlDSN := fs.String("mysql", "root@tcp(127.0.0.1:3306)/flashsale", "MariaDB data source name (go-sql-driver/mysql)")
	name := fs.String("name", fmt.Sprintf("svc-%d", os.Getpid()), "this process's name (its order writer's consumer name)")
	claimIdle := fs.Duration("claim-idle", 5*time.Second, "take over another writer's order after it was pending this long")
	fs.StringVar(&cfg.sale, "sale", "demo", "the sale's name (prefix of its keys)")
	fs.StringVar(&cfg.strategy, "strategy", strategyLua, "mutex, lua or semaphore")
	fs.IntVar(&cfg.ratePerMinute, "rate", 10, "purchases a user may attempt per minute")
	fs.StringVar(&cfg.limiter, "limiter", limiterGCRA, "the rate limiter: gcra (go-redis/redis_rate) or window (fixed window, one script)")
	fs.DurationVar(&cfg.lockTTL, "lock-ttl", 2*time.Second, "TTL of item locks and checkout permits")
	fs.DurationVar(&cfg.lockWait, "lock-wait", 3*time.Second, "longest wait for a lock or a permit")
	fs.IntVar(&cfg.permits, "permits", 16, "checkout permits (semaphore)")
	fs.DurationVar(&cfg.checkoutDelay, "checkout-delay", 5*time.Millisecond, "the slower checkout's extra work (semaphore)")
	fs.BoolVar(&cfg.fair, "fair", false, "item locks serve waiters in arrival order (mutex)")
	fs.BoolVar(&cfg.unfenced, "unfenced", false, "drop the mutex strategy's fence check, to show what it prevents (never for a real sale)")
	verbose := fs.Bool("v", false, "log each failed purchase")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("proc", *name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := serve(ctx, log, cfg, *addr, *redisAddr, *mysqlDSN, *name, *claimIdle); err != nil {
		log.Error("flashsale: serve", "err", err)
		return 1
	}
	return 0
}

// serve runs the service and an order writer until ctx ends.
func serve(ctx context.Context, log *slog.Logger, cfg serviceConfig, addr, redisAddr, mysqlDSN, name string, claimIdle time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true,
		PoolSize: 64, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	defer rdb.Close()
	db, err := sql.Open("mysql", mysqlDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)

	k := keys{sale: cfg.sale}
	lim, err := newLimiter(cfg.limiter, rdb, k, cfg.ratePerMinute, time.Minute)
	if err != nil {
		return err
	}
	locks := dlock.New(redislock.New(rdb), dlock.WithLogger(log))
	defer locks.Close()
	s := &service{cfg: cfg, k: k, rdb: rdb, locks: locks, limiter: lim, log: log}
	w := &writer{rdb: rdb, db: db, k: s.k, consumer: name, claimIdle: claimIdle, log: log}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wctx, stopWriter := context.WithCancel(context.Background())
	wg.Add(2)
	go func() {
		defer wg.Done()
		w.run(wctx)
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Printf("listening %s\n", ln.Addr())
	err = srv.Serve(ln)
	// The writer stops after the last request: a graceful stop leaves no
	// order of its own unwritten if the stores are up.
	stopWriter()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

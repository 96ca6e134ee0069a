// Command presence is a device-presence service on Redis: devices send
// heartbeats, each heartbeat sets a key with a time to live, the online
// list is the keys still alive, and one sweeper, elected among the service
// instances with a dlock Election, publishes each "went offline" event once.
//
//	go run ./examples/presence -redis 127.0.0.1:6379 -simulate 20
//
// Several instances (each with its own -addr) may share one Redis; see
// README.md for where the lock is, and is not, the right tool.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

func main() {
	var (
		addr     = flag.String("addr", "127.0.0.1:8080", "HTTP listen address")
		redisURL = flag.String("redis", "127.0.0.1:6379", "Redis address (host:port) or redis:// URL")
		fleet    = flag.String("fleet", "default", "name of the fleet of devices (the keys' hash tag)")
		ttl      = flag.Duration("ttl", 10*time.Second, "a device is online for this long after its last heartbeat")
		sweep    = flag.Duration("sweep", time.Second, "time between two sweeps for expired devices")
		lockTTL  = flag.Duration("lock-ttl", 5*time.Second, "time to live of the sweeper's election lease")
		simulate = flag.Int("simulate", 0, "simulate this many devices in this process; some stop, and the events are printed")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, log, *addr, *redisURL, *fleet, *ttl, *sweep, *lockTTL, *simulate); err != nil {
		log.Error("presence", "err", err)
		os.Exit(1)
	}
}

// redisOptions parses a host:port or a redis:// URL.
func redisOptions(s string) (*redis.Options, error) {
	opt := &redis.Options{Addr: s}
	if strings.HasPrefix(s, "redis://") || strings.HasPrefix(s, "rediss://") {
		o, err := redis.ParseURL(s)
		if err != nil {
			return nil, err
		}
		opt = o
	}
	// Bound each command by its context, as redislock.New advises.
	opt.ContextTimeoutEnabled = true
	return opt, nil
}

// serve runs the HTTP service and the sweeper until ctx ends.
func serve(ctx context.Context, log *slog.Logger, addr, redisURL, fleet string, ttl, sweep, lockTTL time.Duration, simulate int) error {
	opt, err := redisOptions(redisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	locks := dlock.New(redislock.New(rdb), dlock.WithLogger(log))
	defer locks.Close()

	st := &store{rdb: rdb, fleet: fleet, ttl: ttl}
	sw := &sweeper{store: st, locks: locks, lockTTL: lockTTL, interval: sweep, log: log}

	srv := &http.Server{Addr: addr, Handler: handler(st), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = sw.run(ctx)
	}()
	if simulate > 0 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			simulateDevices(ctx, st, simulate, ttl)
		}()
		go func() {
			defer wg.Done()
			printEvents(ctx, st)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("presence: listening", "addr", addr, "fleet", fleet, "ttl", ttl)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// handler serves POST /devices/{id}/heartbeat, GET /online and
// GET /events?after=ID.
func handler(st *store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /devices/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		came, err := st.heartbeat(r.Context(), r.PathValue("id"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, map[string]bool{"cameOnline": came})
	})
	mux.HandleFunc("GET /online", func(w http.ResponseWriter, r *http.Request) {
		ids, err := st.online(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, ids)
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		after := r.URL.Query().Get("after")
		if after == "" {
			after = "0"
		}
		evs, err := st.events(r.Context(), after, 1000, 0)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, evs)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// simulateDevices runs n devices that send a heartbeat every ttl/3; each
// stops for a while now and then, so that it goes offline and comes back.
func simulateDevices(ctx context.Context, st *store, n int, ttl time.Duration) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("device-%03d", i)
			t := time.NewTimer(0)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				_, _ = st.heartbeat(ctx, id)
				next := ttl / 3
				if rand.IntN(20) == 0 { // a device drops off now and then
					next = 2 * ttl
				}
				t.Reset(next)
			}
		}()
	}
}

// printEvents prints the events stream as it grows.
func printEvents(ctx context.Context, st *store) {
	after := "$"
	for ctx.Err() == nil {
		evs, err := st.events(ctx, after, 100, time.Second)
		if err != nil {
			pause := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-pause.C:
			}
			pause.Stop()
			continue
		}
		for _, e := range evs {
			fmt.Printf("%s %-8s %s\n", time.Now().Format("15:04:05.000"), e.Kind, e.Device)
			after = e.ID
		}
	}
}

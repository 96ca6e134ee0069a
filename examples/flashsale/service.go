// The HTTP service: POST /buy, with the per-user rate limit in front and
// one of three strategies behind.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Strategies a service can sell with.
const (
	strategyMutex     = "mutex"     // a dlock Mutex per item: fenced read, decide, fenced write
	strategyLua       = "lua"       // one atomic script, no lock
	strategySemaphore = "semaphore" // a dlock Semaphore admits N buyers into a slower checkout
)

// serviceConfig is what a service process is told.
type serviceConfig struct {
	sale          string
	strategy      string
	ratePerMinute int           // purchases a user may attempt per minute
	limiter       string        // limiterGCRA or limiterWindow
	lockTTL       time.Duration // TTL of the item locks and checkout permits
	lockWait      time.Duration // longest wait for a lock or a permit
	permits       int           // checkout permits (semaphore)
	checkoutDelay time.Duration // the slower checkout's extra work (semaphore)
	fair          bool          // item locks serve waiters in arrival order (mutex)
	// unfenced drops the mutex strategy's fence check, to show what it
	// prevents: never for a real sale.
	unfenced bool
}

// service answers purchases.
type service struct {
	cfg     serviceConfig
	k       keys
	rdb     *redis.Client
	locks   *dlock.Client
	limiter limiter
	log     *slog.Logger

	// beforeWrite, when set, runs between the mutex strategy's read and
	// its write: the tests pause a holder there.
	beforeWrite func()
}

// buyReply is the body of a /buy answer.
type buyReply struct {
	Answer string `json:"answer"`
}

// handler serves POST /buy?user=U&item=I&id=KEY[&retry=1] and GET /healthz.
// The answers: 200 with "ok" or "soldout"; 429 when the user is over the
// rate limit; 503 when the purchase could not be decided (a store down, a
// lock not obtained in time): the client may send the same request, with
// the same id, again.
func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("POST /buy", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		o := order{ID: q.Get("id"), User: q.Get("user"), Item: q.Get("item")}
		if o.ID == "" || o.User == "" || o.Item == "" {
			http.Error(w, "id, user and item are required", http.StatusBadRequest)
			return
		}
		ans, code, err := s.buy(r.Context(), o, q.Get("retry") != "")
		if err != nil {
			s.log.Debug("flashsale: buy", "order", o.ID, "err", err)
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(buyReply{Answer: ans})
	})
	return mux
}

// errRateLimited is the answer to a user over the rate limit.
var errRateLimited = errors.New("rate limited")

// buy decides one purchase. A retried request is first looked up, so that
// a copy of a request that was served is answered as it was, even when the
// user is now over the limit.
func (s *service) buy(ctx context.Context, o order, retry bool) (answer string, code int, err error) {
	if retry {
		ans, err := earlierAnswer(ctx, s.rdb, s.k, o.ID)
		if err != nil {
			return "", http.StatusServiceUnavailable, err
		}
		if ans != "" {
			return ans, http.StatusOK, nil
		}
	}
	allowed, err := s.limiter.allow(ctx, o.User)
	if err != nil {
		return "", http.StatusServiceUnavailable, fmt.Errorf("rate limit: %w", err)
	}
	if !allowed {
		return "", http.StatusTooManyRequests, errRateLimited
	}
	switch s.cfg.strategy {
	case strategyLua:
		answer, err = sell(ctx, s.rdb, s.k, o)
	case strategyMutex:
		answer, err = s.buyLocked(ctx, o)
	case strategySemaphore:
		answer, err = s.buyAdmitted(ctx, o)
	default:
		err = fmt.Errorf("unknown strategy %q", s.cfg.strategy)
	}
	if err == nil && answer == answerStale {
		err = errors.New("the item lock's lease ran out; nothing was written")
	}
	if err != nil {
		return "", http.StatusServiceUnavailable, err
	}
	return answer, http.StatusOK, nil
}

// buyLocked sells under the item's lock: a fenced read of the stock, the
// decision in Go, and a fenced write of the new stock together with the
// order. The fence is claimed at the read, so a holder whose lease ran out
// after it read cannot write what it computed from a value a newer holder
// has since changed.
func (s *service) buyLocked(ctx context.Context, o order) (answer string, err error) {
	name := s.k.lock(o.Item)
	err = s.locks.Do(ctx, name, func(ctx context.Context) error {
		lease, _ := dlock.LeaseFromContextByName(ctx, name)
		fence, err := fenceArg(lease.Fence(), s.cfg.unfenced)
		if err != nil {
			return err
		}
		stock, done, err := claimWith(ctx, s.rdb, s.k, o, fence)
		switch {
		case err != nil:
			return err
		case done != "":
			answer = done
			return nil
		case stock <= 0:
			answer = answerSoldOut
			return nil
		}
		if s.beforeWrite != nil {
			s.beforeWrite()
		}
		answer, err = sellWith(ctx, s.rdb, s.k, o, fence, stock-1)
		return err
	}, s.itemLockOptions()...)
	if answer == answerOK {
		// The fenced write was accepted: the sale stands even if the lease
		// was lost or the unlock failed afterwards.
		return answer, nil
	}
	return answer, err
}

// itemLockOptions returns the options of an item's lock.
func (s *service) itemLockOptions() []dlock.Option {
	opts := []dlock.Option{dlock.WithTTL(s.cfg.lockTTL), dlock.WithWait(s.cfg.lockWait)}
	if s.cfg.fair {
		opts = append(opts, dlock.Fair())
	}
	return opts
}

// buyAdmitted admits the buyer into the slower checkout with a permit of
// the checkout semaphore, does the checkout's work (payment, risk checks:
// here a delay) and sells with the atomic script. The semaphore bounds how
// many checkouts run at once; the script, not the semaphore, keeps the
// stock right.
func (s *service) buyAdmitted(ctx context.Context, o order) (string, error) {
	// Do not queue for a permit when nothing is left.
	if n, err := stockOf(ctx, s.rdb, s.k, o.Item); err != nil {
		return "", err
	} else if n <= 0 {
		return answerSoldOut, nil
	}
	permit, err := s.locks.Semaphore(s.k.checkout(), s.cfg.permits,
		dlock.WithTTL(s.cfg.lockTTL), dlock.WithWait(s.cfg.lockWait)).Acquire(ctx)
	if err != nil {
		return "", err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.lockTTL)
		defer cancel()
		_ = permit.Unlock(uctx)
	}()
	work, stop := context.WithCancel(ctx)
	defer stop()
	unlink := context.AfterFunc(permit.Context(), stop)
	defer unlink()
	t := time.NewTimer(s.cfg.checkoutDelay)
	defer t.Stop()
	select {
	case <-work.Done():
		return "", fmt.Errorf("checkout: %w", context.Cause(work))
	case <-t.C:
	}
	return sell(work, s.rdb, s.k, o)
}

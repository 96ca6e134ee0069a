// The load generator: many buyers, spread over the service processes.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// outcome is the final answer to one purchase request.
type outcome struct {
	answer  string // answerOK, answerSoldOut, "limited" or "failed"
	latency time.Duration
	retries int
}

// Final answers besides the service's.
const (
	outcomeLimited = "limited"
	outcomeFailed  = "failed"
)

// requestTimeout bounds one request, retries included.
const requestTimeout = 30 * time.Second

// load sends cfg.requests purchase requests, cfg.concurrency at a time,
// and runs the faults as the answers come in.
func (r *run) load(ctx context.Context, rep *report) error {
	n := r.cfg.requests
	addrs := make([]string, len(r.procs))
	for i, p := range r.procs {
		addrs[i] = p.addr // a restarted process keeps its address
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		MaxIdleConns: r.cfg.concurrency * 2, MaxIdleConnsPerHost: r.cfg.concurrency}}
	defer client.CloseIdleConnections()

	outcomes := make([]outcome, n)
	var next, answered atomic.Int64
	faultErr := make(chan error, 1)
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for _, f := range r.cfg.faults {
			for answered.Load() < int64(f.at*float64(n)) && ctx.Err() == nil {
				<-tick.C
			}
			begin := time.Now()
			err := f.do(r)
			line := fmt.Sprintf("%s at %d/%d answered (took %v)", f.name, answered.Load(), n, time.Since(begin).Round(time.Millisecond))
			if sold, queued, err := r.progress(ctx); err == nil {
				line += fmt.Sprintf("; then %d units sold, %d orders not yet in MariaDB", sold, queued)
			}
			if err != nil {
				line += ": " + err.Error()
				select {
				case faultErr <- fmt.Errorf("fault %s: %w", f.name, err):
				default:
				}
			}
			r.cfg.logf("fault: %s", line)
			rep.Faults = append(rep.Faults, line)
		}
	}()

	start := time.Now()
	var wg sync.WaitGroup
	for range r.cfg.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				outcomes[i] = r.request(ctx, client, addrs, i)
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	rep.Elapsed = time.Since(start)
	<-faultsDone
	select {
	case err := <-faultErr:
		return err
	default:
	}

	var lat []time.Duration
	for i, o := range outcomes {
		rep.Retries += o.retries
		switch o.answer {
		case answerOK:
			rep.Confirmed++
			r.confirmedIDs = append(r.confirmedIDs, r.orderID(i))
		case answerSoldOut:
			rep.SoldOut++
			r.refusedIDs = append(r.refusedIDs, r.orderID(i))
		case outcomeLimited:
			rep.Limited++
			r.refusedIDs = append(r.refusedIDs, r.orderID(i))
		default:
			rep.Failed++
			continue
		}
		lat = append(lat, o.latency)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		rep.P50 = lat[len(lat)*50/100]
		rep.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	rep.Throughput = float64(len(lat)) / rep.Elapsed.Seconds()
	return nil
}

func (r *run) orderID(i int) string { return fmt.Sprintf("%s-%d", r.k.sale, i) }

// request sends purchase request i until it gets a final answer: on a
// broken connection or a 503 it sends the same request (same id) again,
// to the next process.
func (r *run) request(ctx context.Context, client *http.Client, addrs []string, i int) outcome {
	rng := rand.New(rand.NewPCG(uint64(i), 0x5eed))
	user := rng.IntN(r.cfg.users)
	item := itemName(rng.IntN(r.cfg.items))
	id := r.orderID(i)
	begin := time.Now()
	backoff := time.NewTimer(0)
	<-backoff.C
	defer backoff.Stop()
	for attempt := 0; ; attempt++ {
		addr := addrs[(i+attempt)%len(addrs)]
		url := fmt.Sprintf("http://%s/buy?user=u%d&item=%s&id=%s", addr, user, item, id)
		if attempt > 0 {
			url += "&retry=1"
		}
		if ans, final := r.post(ctx, client, url); final {
			return outcome{answer: ans, latency: time.Since(begin), retries: attempt}
		}
		if time.Since(begin) > requestTimeout || ctx.Err() != nil {
			return outcome{answer: outcomeFailed, latency: time.Since(begin), retries: attempt}
		}
		backoff.Reset(time.Duration(min(attempt+1, 10)) * 20 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-backoff.C:
		}
	}
}

// post sends one request; final is false when it should be sent again.
func (r *run) post(ctx context.Context, client *http.Client, url string) (answer string, final bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return outcomeFailed, true
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", false
	}
	switch resp.StatusCode {
	case http.StatusOK:
		var b buyReply
		if err := json.Unmarshal(body, &b); err != nil {
			return "", false
		}
		return b.Answer, true
	case http.StatusTooManyRequests:
		return outcomeLimited, true
	case http.StatusBadRequest:
		return outcomeFailed, true
	}
	return "", false
}

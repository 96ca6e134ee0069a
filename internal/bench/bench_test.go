package bench

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunRedis(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	newClient := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }
	counter := RedisCounter{newClient()}
	defer counter[0].Close()
	subject := func(name string, opts ...dlock.Option) Subject {
		trips := new(Trips)
		s := Dlock(name, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
			rdb := newClient()
			rdb.AddHook(trips.RedisHook())
			return redislock.New(rdb), rdb.Close, nil
		}, opts...)
		s.Counter, s.Trips = counter, trips
		return s
	}
	sub, fair := subject("dlock"), subject("dlock-fair", dlock.Fair())
	rawTrips := new(Trips)
	raw := RawRedis("raw", func() redis.UniversalClient {
		rdb := newClient()
		rdb.AddHook(rawTrips.RedisHook())
		return rdb
	}, 10*time.Second)
	raw.Counter, raw.Trips = counter, rawTrips
	rep := &Report{Machine: ThisMachine()}
	rtt, err := RedisRTT(ctx, counter[0], 200)
	if err != nil {
		t.Fatal(err)
	}
	rep.Baselines = map[string]Percentiles{"ping": rtt}
	for _, w := range []Workload{
		{Workers: 1, Names: 1, Duration: time.Second},
		{Workers: 8, Names: 1, CS: 100 * time.Microsecond, Duration: 2 * time.Second},
	} {
		for _, s := range []Subject{raw, sub, fair} {
			r, err := Run(ctx, s, w, nil)
			if err != nil {
				t.Fatal(err)
			}
			rep.Results = append(rep.Results, r)
		}
	}
	rep.WriteTable(os.Stdout)
	for _, r := range rep.Results {
		t.Logf("%s %s ops %v", r.Subject, r.Workload, r.Ops)
	}
}

func TestRunMemlock(t *testing.T) {
	store := memlock.New()
	sub := Dlock("dlock", func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		return store, nil, nil
	})
	r, err := Run(context.Background(), sub, Workload{Workers: 4, Names: 3, Duration: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
}

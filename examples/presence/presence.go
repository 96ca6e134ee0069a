// The presence store: heartbeats set a key with a time to live, the online
// list is the set of keys still alive, and the "went online" and "went
// offline" events go to one Redis stream.

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

// Event kinds in the events stream.
const (
	eventOnline  = "online"
	eventOffline = "offline"
)

// streamMaxLen bounds the events stream (approximately: MAXLEN ~).
const streamMaxLen = 100000

var (
	//go:embed heartbeat.lua
	heartbeatSrc    string
	heartbeatScript = redis.NewScript(heartbeatSrc)

	//go:embed offline.lua
	offlineSrc    string
	offlineScript = redis.NewScript(offlineSrc)
)

// errStaleSweeper is returned by markOffline when a sweeper with a newer
// fence has already written: the caller is no longer the elected sweeper.
var errStaleSweeper = errors.New("presence: a newer sweeper has taken over")

// store keeps the presence of one fleet of devices in Redis. Every key of a
// fleet carries the fleet's name as a hash tag, so that on Redis Cluster the
// scripts that touch several of them run on one node.
type store struct {
	rdb   redis.UniversalClient
	fleet string
	ttl   time.Duration // how long a device stays online after a heartbeat
}

func (s *store) prefix() string             { return "presence:{" + s.fleet + "}:" }
func (s *store) deviceKey(id string) string { return s.prefix() + "dev:" + id }
func (s *store) knownKey() string           { return s.prefix() + "known" }
func (s *store) eventsKey() string          { return s.prefix() + "events" }
func (s *store) fenceKey() string           { return s.prefix() + "sweeper-fence" }

// heartbeat marks device online for the store's TTL. It reports whether the
// device was not online before, in which case it also appended an "online"
// event, after the "offline" event of an absence no sweep had announced
// yet (its key expired and came back between two sweeps). No lock: the
// write is one idempotent script, and the expiry is decided by Redis's
// clock.
func (s *store) heartbeat(ctx context.Context, device string) (cameOnline bool, err error) {
	n, err := heartbeatScript.Run(ctx, s.rdb,
		[]string{s.deviceKey(device), s.knownKey(), s.eventsKey(), s.fenceKey()},
		device, s.ttl.Milliseconds(), streamMaxLen).Int()
	if err != nil {
		return false, fmt.Errorf("presence: heartbeat %q: %w", device, err)
	}
	return n == 1, nil
}

// online returns the devices whose heartbeat key is alive: the devices of
// the known set, checked with one pipelined EXISTS each. A device is absent
// from the list as soon as its key has expired, even before the sweeper has
// published its "offline" event.
func (s *store) online(ctx context.Context) ([]string, error) {
	known, err := s.known(ctx)
	if err != nil {
		return nil, err
	}
	alive, err := s.alive(ctx, known)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, id := range known {
		if alive[i] {
			out = append(out, id)
		}
	}
	return out, nil
}

// known returns the devices that were announced online and not yet
// announced offline.
func (s *store) known(ctx context.Context) ([]string, error) {
	var out []string
	iter := s.rdb.SScan(ctx, s.knownKey(), 0, "", 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("presence: list known devices: %w", err)
	}
	return out, nil
}

// alive reports, for each device, whether its heartbeat key exists.
func (s *store) alive(ctx context.Context, devices []string) ([]bool, error) {
	if len(devices) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.IntCmd, len(devices))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range devices {
			cmds[i] = p.Exists(ctx, s.deviceKey(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("presence: check heartbeat keys: %w", err)
	}
	out := make([]bool, len(devices))
	for i, c := range cmds {
		out[i] = c.Val() == 1
	}
	return out, nil
}

// markOffline appends the "offline" event of device, in one script, when
// its heartbeat key is gone and it is still in the known set, and removes
// it from that set. It is fenced: the script refuses a sweeper whose fence
// is older than one it has already accepted (errStaleSweeper). It reports
// whether it published the event; false with a nil error means the device
// came back or another sweep already published it.
func (s *store) markOffline(ctx context.Context, fence uint64, device string) (bool, error) {
	n, err := offlineScript.Run(ctx, s.rdb,
		[]string{s.fenceKey(), s.knownKey(), s.deviceKey(device), s.eventsKey()},
		strconv.FormatUint(fence, 10), device, streamMaxLen).Int()
	switch {
	case err != nil:
		return false, fmt.Errorf("presence: mark %q offline: %w", device, err)
	case n < 0:
		return false, fmt.Errorf("presence: mark %q offline with fence %d: %w", device, fence, errStaleSweeper)
	}
	return n == 1, nil
}

// event is one entry of the events stream.
type event struct {
	ID     string
	Device string
	Kind   string // eventOnline or eventOffline
	Fence  uint64 // the sweeper's fence, for offline events
}

// events reads the stream after the entry with ID after ("0" for all),
// at most count entries, waiting up to block for the first (0: do not
// wait).
func (s *store) events(ctx context.Context, after string, count int64, block time.Duration) ([]event, error) {
	args := &redis.XReadArgs{Streams: []string{s.eventsKey(), after}, Count: count, Block: -1}
	if block > 0 {
		args.Block = block
	}
	res, err := s.rdb.XRead(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("presence: read events: %w", err)
	}
	var out []event
	for _, st := range res {
		for _, m := range st.Messages {
			e := event{ID: m.ID}
			e.Device, _ = m.Values["device"].(string)
			e.Kind, _ = m.Values["event"].(string)
			if f, ok := m.Values["fence"].(string); ok {
				e.Fence, _ = strconv.ParseUint(f, 10, 64)
			}
			out = append(out, e)
		}
	}
	return out, nil
}

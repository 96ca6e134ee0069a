package redlock_test

import (
	"testing"
)

// Redlock never hands a lock off (no driver.CapFair), yet each node's
// redislock listener now subscribes a handoff channel per key besides the
// release channel: one SUBSCRIBE and one server-side channel per key and
// node that nothing ever publishes to.
func TestReview45RedlockSubscribesOneChannelPerKey(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	l, _ := listen(t, b)
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	for i, srv := range servers {
		chs, err := srv.Client(t).PubSubChannels(t.Context(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(chs) != 1 {
			t.Errorf("node %d: channels %q after one Subscribe; want the release channel alone", i, chs)
		}
	}
}

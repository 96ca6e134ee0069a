// Which grants no copy of a request can reach late: the grants whose
// acquire requests go-redis wrote once each, and whose answers came back.

package redislock

import (
	"sync"
	"sync/atomic"
)

// requestArg is a request id as a script argument that counts how many
// times go-redis writes it. go-redis marshals an argument each time it
// writes the command to a connection (a resend after a lost answer, a
// pipeline sent again, a redirect on a Cluster); formatting a command for a
// log or a trace reads String instead.
type requestArg struct {
	id     string
	writes atomic.Int32
}

// MarshalBinary counts a write of the request.
func (r *requestArg) MarshalBinary() ([]byte, error) {
	r.writes.Add(1)
	return []byte(r.id), nil
}

// String returns the id.
func (r *requestArg) String() string { return r.id }

// once reports whether the request was written exactly once. Asked after
// its answer came back, that means no other copy of it exists: nothing of
// it can land later.
func (r *requestArg) once() bool { return r.writes.Load() == 1 }

// onceGrants remembers, for the exclusive grants this Backend made, the
// fence of each whose acquire requests (the first and every re-entry) were
// written once each and answered: a copy of a request can land after the
// grant's release only when go-redis wrote it twice. The release of such a
// grant tells the script so, and it records none of the grant's requests
// in the late-request record (late.lua), which then costs nothing on a
// name whose requests reach the server at the first try.
//
// What it does not know is recorded as before: a grant made by another
// Backend (an owner ID shared between processes), a grant taken from a
// handoff announcement, a grant once the map was cleared. Entries of grants
// that end without a release (a lost lease) stay until the map reaches
// onceMax entries and is emptied of them.
type onceGrants struct {
	mu sync.Mutex
	m  map[onceKey]onceGrant
}

type onceKey struct{ key, token string }

// onceGrant is what is known of one grant: its fence, and whether one of
// its requests was written more than once (then that stays known, whatever
// answer of another request of the grant is read after).
type onceGrant struct {
	fence uint64
	again bool
}

// onceMax bounds the entries of onceGrants.
const onceMax = 1 << 14

// granted records the answer to an acquire of key by token: a grant with
// fence, token's holds after it, whose request req was written once or
// more. A first hold (holds 1) written once is remembered; a request of
// the grant written more than once marks it for good; a re-entry written
// once changes nothing.
func (g *onceGrants) granted(key, token string, fence uint64, holds int, req *requestArg) {
	once := req.once()
	if once && holds != 1 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k := onceKey{key, token}
	if was, ok := g.m[k]; ok && was.fence == fence && was.again {
		return
	}
	if g.m == nil {
		g.m = map[onceKey]onceGrant{}
	}
	if len(g.m) >= onceMax {
		// Forgetting a grant written once costs its release a record;
		// forgetting one written again could skip one, so those go last.
		for k, e := range g.m {
			if !e.again || len(g.m) > 2*onceMax {
				delete(g.m, k)
			}
		}
	}
	g.m[k] = onceGrant{fence: fence, again: !once}
}

// fence returns the fence of token's grant on key when its requests were
// written once each, or 0.
func (g *onceGrants) fence(key, token string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[onceKey{key, token}]; !e.again {
		return e.fence
	}
	return 0
}

// refenced gives token's grant on key, when known, the fence fence
// (package redlock gives a grant one fence on all its nodes).
func (g *onceGrants) refenced(key, token string, fence uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := onceKey{key, token}
	if e, ok := g.m[k]; ok {
		e.fence = fence
		g.m[k] = e
	}
}

// forget drops what is known of token's grant on key: it was released.
func (g *onceGrants) forget(key, token string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.m, onceKey{key, token})
}

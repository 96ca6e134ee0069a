// Which acquire requests no copy of can land late: those that go-redis
// wrote once, and whose answers came back.

package redislock

import (
	"slices"
	"strings"
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

// onceGrants remembers, per key and token, the ids of the exclusive grants'
// requests (the first and every re-entry) that go-redis wrote once and
// whose grant this Backend read: no copy of them can land after the
// grant's release. The release names them, and the script records the
// grant's other requests only in the late-request record (late.lua), which
// then costs nothing on a name whose requests reach the server at the
// first try.
//
// A request it does not name is recorded as before: one written twice, one
// whose answer was not read (its outcome unknown), one sent by another
// Backend with the same token (an owner ID shared between Clients), a grant
// taken from a handoff announcement. It also keeps the ids of the token's
// requests of which a copy may still be on its way (an answer never read,
// or a request written twice: a queued waiter's, whose first copy may land
// after the grant it was handed), for the release to record even when they
// did not reach the grant it deletes.
// Entries of grants that end without a release of this Backend (a lost
// lease) stay until the map reaches onceMax entries (see entry).
type onceGrants struct {
	mu sync.Mutex
	m  map[onceKey]*onceEntry
}

type onceKey struct{ key, token string }

// onceEntry is what is known of one token's requests on one key.
type onceEntry struct {
	once []string // written once, their grants read
	lost []string // a copy of them may still land
}

// onceMax bounds the entries of onceGrants; onceIDs, the ids of each kind
// kept per entry: acquire.lua keeps the latest 16 ids of a grant, and an
// id a release does not name is recorded, which is safe.
const onceMax, onceIDs = 1 << 14, 16

// entry returns the entry of token on key, made when missing; g.mu is held.
func (g *onceGrants) entry(key, token string) *onceEntry {
	if g.m == nil {
		g.m = map[onceKey]*onceEntry{}
	}
	if len(g.m) >= onceMax {
		// Forgetting a grant's ids costs its release a record; the
		// requests of which a copy may land are kept, but when they fill
		// half the map (they are then all forgotten, and left
		// unrecorded): a sweep frees half of it at least.
		for k, e := range g.m {
			if len(e.lost) == 0 {
				delete(g.m, k)
			}
		}
		if len(g.m) > onceMax/2 {
			g.m = map[onceKey]*onceEntry{}
		}
	}
	k := onceKey{key, token}
	e := g.m[k]
	if e == nil {
		e = &onceEntry{}
		g.m[k] = e
	}
	return e
}

// keep returns ids with id after them, the latest onceIDs.
func keep(ids []string, id string) []string {
	if len(ids) >= onceIDs {
		ids = append(ids[:0:0], ids[len(ids)-onceIDs+1:]...)
	}
	return append(ids, id)
}

// granted records that req, written once or more, was answered by an
// exclusive grant of key to token.
func (g *onceGrants) granted(key, token string, req *requestArg) {
	if !req.once() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entry(key, token)
	e.once = keep(e.once, req.id)
}

// mayLand records that a copy of req, an acquire of key by token, may
// still land: it was written twice, or once without its answer read
// (answered tells).
func (g *onceGrants) mayLand(key, token string, req *requestArg, answered bool) {
	if n := req.writes.Load(); n == 0 || (answered && n == 1) {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entry(key, token)
	e.lost = keep(e.lost, req.id)
}

// ids returns the ids of token's requests on key written once and granted,
// the newest first as acquire.lua keeps a grant's (so that a grant all of
// whose requests are named matches them as they are), and those of which a
// copy may still land, each space-separated, or "".
func (g *onceGrants) ids(key, token string) (once, lost string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.m[onceKey{key, token}]; e != nil {
		if len(e.once) <= 1 && len(e.lost) <= 1 {
			return first(e.once), first(e.lost) // most grants: no copy made
		}
		newest := slices.Clone(e.once)
		slices.Reverse(newest)
		return strings.Join(newest, " "), strings.Join(e.lost, " ")
	}
	return "", ""
}

// forget drops what is known of token's requests on key that a release
// named, once and lost as ids returned them: the release deleted the
// token's grant, or found it holding nothing, and recorded those that may
// land. Ids learnt while it was on its way stay, for the next release.
func (g *onceGrants) forget(key, token, once, lost string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := onceKey{key, token}
	e := g.m[k]
	if e == nil {
		return
	}
	if len(e.once) <= 1 && len(e.lost) <= 1 && first(e.once) == once && first(e.lost) == lost {
		delete(g.m, k) // all named: most grants
		return
	}
	e.once, e.lost = unnamed(e.once, once), unnamed(e.lost, lost)
	if len(e.once) == 0 && len(e.lost) == 0 {
		delete(g.m, k)
	}
}

// first returns the one id of ids, or "" for none.
func first(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// unnamed returns the ids of ids that named, space-separated, does not
// hold.
func unnamed(ids []string, named string) []string {
	var out []string
	drop := strings.Fields(named)
	for _, id := range ids {
		if !slices.Contains(drop, id) {
			out = append(out, id)
		}
	}
	return out
}

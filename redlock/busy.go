// The answer of a Redlock acquire that nodes held by others refused.
//
// The nodes that refused fall in two groups. Waits: for an exclusive
// request, nodes refused because of shared holds (readers); for a shared
// request, nodes refused because of another token's writer intent.
// Contenders: the nodes refused by an exclusive holder. The answer is, in
// this order:
//
//   - When one exclusive owner holds a quorum of nodes, that owner, and
//     HolderTTL the time at which, at the earliest, enough of the busy
//     nodes will have let go, assuming the nodes that did not report a
//     holder are free: of the b busy nodes, the (b−N+Q)-th shortest
//     remaining TTL.
//   - When the waits alone block every quorum (N−Q+1 of them) and, for
//     readers, the nodes not granted to this attempt nor held exclusively
//     leave room for a quorum of readers, the readers (or the writer
//     intents): Holder the owner most of those nodes reported, HolderTTL
//     the time until enough of them will have let go (by the same rule,
//     over those nodes), Shared the Q-th highest count of shared holds
//     they reported (a hold left on a minority by an attempt that lost,
//     not yet undone, is not counted), and WriterWaiting for a shared
//     request. Readers hold their quorum for as long as they renew:
//     retrying before then, without a release, would only find them
//     again. A writer that waits has recorded its intent on those nodes
//     and comes back within a third of its QueueTTL anyway (Queued).
//   - Otherwise the nodes are split between contenders, all of which fail
//     and undo their grants at once (an owner with fewer than a quorum of
//     nodes is one of them, even when it blocks ours, and so is an attempt
//     of a reader that won only some nodes); then HolderTTL is a random
//     time between a fifth of and one node timeout, doubled for each split
//     of the key in a row up to eight times (see Backend.splitDelay), so
//     that the contenders come back one at a time instead of splitting the
//     nodes again, and Holder the owner most of the refusing nodes report,
//     other than the requester's own when another is reported.
//
// Contenders are told apart by their owner descriptions, which the dlock
// client makes per Client and second, so contenders of one Client (two
// tokens of one name, say Lock and TryLock at once) can look like one
// owner. When the blocking owner is of this process and this attempt won
// some nodes, the result is treated as a possible split too.
//
// Before all of that, when the nodes that answered with a conflict
// (driver.AcquireResult.Conflict: a redislock client's semaphore permits
// beside this reader) block every quorum, the result is that conflict,
// with their Limit, their owner most reported and the rule above for
// HolderTTL and Shared.
//
// Queued is set when any node kept a writer intent of this request.

package redlock

import (
	"slices"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// busyResult is the answer when nodes held by others make a quorum
// impossible; yes is how many nodes granted this attempt. The file's
// comment gives the rules.
func (a *attempt) busyResult(busy []answer[driver.AcquireResult], yes int) driver.AcquireResult {
	n, q := len(a.b.nodes), a.b.Quorum()
	block := n - q + 1 // refusals that make a quorum impossible
	shared := a.req.Mode == driver.Shared
	waits, contenders := a.classify(busy)
	queued := false
	for _, ans := range busy {
		queued = queued || ans.val.Queued
	}

	// Shared holds of a semaphore, which redlock does not grant, left on
	// the nodes by a redislock client of the same prefix: a reader is
	// refused as a conflict (driver.AcquireResult.Conflict) when they
	// alone block every quorum.
	var conflicts []answer[driver.AcquireResult]
	for _, ans := range busy {
		if ans.val.Conflict {
			conflicts = append(conflicts, ans)
		}
	}
	if len(conflicts) >= block {
		res := driver.AcquireResult{HolderTTL: letGo(conflicts, block), Conflict: true, HeldLimit: conflicts[0].val.HeldLimit, Queued: queued}
		res.Holder, _ = mostReported(conflicts)
		counts := make([]int, 0, len(conflicts))
		for _, ans := range conflicts {
			counts = append(counts, ans.val.Shared)
		}
		res.Shared = kthHighest(counts, min(q, len(counts)))
		return res
	}

	holder, best := mostReported(contenders)
	// A real holder holds a quorum; an owner with fewer nodes, even enough
	// to block ours (with an even N, half of them), is a contender too.
	if best >= q && !(yes > 0 && driver.OfThisProcess(holder)) {
		a.b.noSplit(a.req.Key)
		return driver.AcquireResult{Holder: holder, HolderTTL: letGo(busy, block), Queued: queued}
	}
	// Readers hold a quorum only where neither this attempt nor an
	// exclusive holder does; with an even N, readers on half the nodes
	// can block a writer that holds the other half, and both are
	// contenders. Writer intents need no quorum: on N−Q+1 nodes they keep
	// every reader from one, until the writer is granted or gives up.
	if len(waits) >= block && (shared || n-yes-len(contenders) >= q) {
		a.b.noSplit(a.req.Key)
		res := driver.AcquireResult{HolderTTL: letGo(waits, block), WriterWaiting: shared, Queued: queued}
		res.Holder, _ = mostReported(waits)
		counts := make([]int, 0, len(waits))
		for _, ans := range waits {
			counts = append(counts, ans.val.Shared)
		}
		res.Shared = kthHighest(counts, min(q, len(counts)))
		return res
	}
	return driver.AcquireResult{Holder: a.likelyHolder(busy), HolderTTL: a.b.splitDelay(a.req.Key), Queued: queued}
}

// likelyHolder names, for a split, the holder that most answers of busy
// name other than the requester's own owner: a hold of the requester's
// Client that busy shows is most often one that an attempt of its own left
// on a node and has not undone yet (see attempt.run), not the owner it
// waits for. The own owner is named only when no other is.
func (a *attempt) likelyHolder(busy []answer[driver.AcquireResult]) string {
	others := make([]answer[driver.AcquireResult], 0, len(busy))
	for _, ans := range busy {
		if ans.val.Holder != a.req.Owner {
			others = append(others, ans)
		}
	}
	if len(others) == 0 {
		others = busy
	}
	holder, _ := mostReported(others)
	return holder
}

// classify splits the refusals of busy into waits (readers refusing a
// writer, writer intents refusing a reader) and contenders (exclusive
// holders, and anything else).
func (a *attempt) classify(busy []answer[driver.AcquireResult]) (waits, contenders []answer[driver.AcquireResult]) {
	shared := a.req.Mode == driver.Shared
	for _, ans := range busy {
		if (shared && ans.val.WriterWaiting) || (!shared && ans.val.Shared > 0) {
			waits = append(waits, ans)
		} else {
			contenders = append(contenders, ans)
		}
	}
	return waits, contenders
}

// readersOpen reports whether a writer refused by readers cannot yet tell
// readers that may hold a quorum from readers that are contenders (see
// busyResult), while the pending answers could tell: readers refused it on
// enough nodes to block a quorum but on fewer than a quorum, which happens
// only with an even N.
func (a *attempt) readersOpen(busy []answer[driver.AcquireResult], t tally) bool {
	if a.req.Mode != driver.Exclusive || t.pending() == 0 {
		return false
	}
	waits, contenders := a.classify(busy)
	return len(waits) >= t.n-t.q+1 && len(waits) < t.q && t.n-t.yes-len(contenders) >= t.q
}

// mostReported returns the holder that most answers name, and how many do.
func mostReported(answers []answer[driver.AcquireResult]) (holder string, count int) {
	counts := make(map[string]int)
	for _, ans := range answers {
		counts[ans.val.Holder]++
		if c := counts[ans.val.Holder]; c > count {
			holder, count = ans.val.Holder, c
		}
	}
	return holder, count
}

// letGo returns the time until enough of the refusing nodes let go that the
// rest no longer block a quorum, block being the number that does: the
// (len−block+1)-th shortest HolderTTL.
func letGo(refusing []answer[driver.AcquireResult], block int) time.Duration {
	if len(refusing) == 0 {
		return 0
	}
	ttls := make([]time.Duration, 0, len(refusing))
	for _, ans := range refusing {
		ttls = append(ttls, ans.val.HolderTTL)
	}
	slices.Sort(ttls)
	return ttls[min(max(len(ttls)-block, 0), len(ttls)-1)]
}

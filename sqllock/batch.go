// RenewBatch: renewing many leases in statements of up to batchSize leases.

package sqllock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

// batchSize is the most leases one renewal statement carries, to stay well
// under every engine's limit on placeholders (MySQL and PostgreSQL 65535,
// SQLite 32766) and packet sizes.
const batchSize = 500

// RenewBatch renews every lease of reqs, exclusive or shared, and returns
// one result per request, in order. Requests for the same key and token
// (holds of one reentrant owner) are sent once, with the longest of their
// TTLs. Exclusive leases take one statement per batchSize leases; the
// leases it did not find (shared holds, or leases no longer held) are
// renewed, or found not held, in one transaction per batch that locks their
// names' rows. On MySQL, which cannot say which rows an UPDATE changed, a
// statement that did not renew every lease hands its whole batch to that
// transaction. A failed statement is reported in the result of each of its
// requests.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	results := make([]driver.RenewResult, len(reqs))
	type pair struct{ key, token string }
	index := make(map[pair]int) // position in unique
	var unique []driver.RenewRequest
	slot := make([]int, len(reqs)) // request → position in unique, or -1
	for i, r := range reqs {
		slot[i] = -1
		if err := b.check(ctx, r.Key, r.Token); err != nil {
			results[i].Err = b.opError(ctx, err)
			continue
		}
		p := pair{r.Key, r.Token}
		j, ok := index[p]
		if !ok {
			j = len(unique)
			index[p] = j
			unique = append(unique, r)
		}
		unique[j].TTL = max(unique[j].TTL, r.TTL)
		slot[i] = j
	}

	held := make([]bool, len(unique))
	errs := make([]error, len(unique))
	for start := 0; start < len(unique); start += batchSize {
		chunk := unique[start:min(start+batchSize, len(unique))]
		ok, err := retryGated(ctx, b, true, func() ([]bool, error) { return b.renewChunk(ctx, chunk) })
		for k := range chunk {
			if err != nil {
				errs[start+k] = b.opError(ctx, err)
			} else {
				held[start+k] = ok[k]
			}
		}
	}
	for i, j := range slot {
		if j >= 0 {
			results[i] = driver.RenewResult{Held: held[j], Err: errs[j]}
		}
	}
	return results
}

// renewChunk renews at most batchSize distinct leases: the exclusive ones in
// one statement, the others in a transaction.
func (b *Backend) renewChunk(ctx context.Context, chunk []driver.RenewRequest) ([]bool, error) {
	held, more, err := b.eng.renewBatch(ctx, chunk)
	if err != nil {
		return nil, err
	}
	var rest []driver.RenewRequest
	var at []int
	for i := range chunk {
		if !held[i] && more[i] {
			rest = append(rest, chunk[i])
			at = append(at, i)
		}
	}
	if len(rest) == 0 {
		return held, nil
	}
	ok, err := b.tx.renew(ctx, rest)
	if err != nil {
		return nil, err
	}
	for k, i := range at {
		held[i] = ok[k]
	}
	return held, nil
}

// fenceParam is the statement parameter for a grant's fence: 0 (no grant
// named) matches every fence.
func fenceParam(fence uint64) int64 { return int64(fence) }

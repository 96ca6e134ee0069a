package sqllock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

// batchSize is the most leases one renewal statement carries, to stay well
// under every engine's limit on placeholders (MySQL and PostgreSQL 65535,
// SQLite 32766) and packet sizes.
const batchSize = 500

// RenewBatch renews every lease of reqs with one statement per batchSize
// leases and returns one result per request, in order. Requests for the same
// key and token (holds of one reentrant owner) are sent once, with the
// longest of their TTLs. On MySQL, which cannot say which rows an UPDATE
// changed, a statement that did not renew every lease is followed by one
// Renew per lease of its batch to tell which were held. A failed statement
// is reported in the result of each of its requests.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	results := make([]driver.RenewResult, len(reqs))
	type pair struct{ key, token string }
	index := make(map[pair]int) // position in unique
	var unique []driver.RenewRequest
	slot := make([]int, len(reqs)) // request → position in unique, or -1
	for i, r := range reqs {
		slot[i] = -1
		if err := b.check(ctx, r.Key, r.Token); err != nil {
			results[i].Err = opError(ctx, "renew", r.Key, err)
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
		ok, err := retryBusy(ctx, b.dialect, func() ([]bool, error) { return b.eng.renewBatch(ctx, chunk) })
		for k := range chunk {
			if err != nil {
				errs[start+k] = opError(ctx, "renew", chunk[k].Key, err)
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

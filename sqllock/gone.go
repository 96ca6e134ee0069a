// The record of tokens that a clean-up released while they held nothing, or
// withdrew: a request of theirs that reaches the database late grants and
// queues nothing.

package sqllock

import "time"

// goneTTL is how long the record of a clean-up lives (the gone table's
// expires_at, by the database's clock).
//
// A statement whose caller gave up (its context ended: the driver closes
// the connection, or sends a cancel request) may still reach the server
// and run after the client's clean-up, which goes out at once on another
// pooled connection. A Release without a fence (the clean-up of an
// acquire of unknown outcome, or of a fair waiter's place) that finds no
// exclusive hold of its token therefore records the token (grants 1), and
// Withdraw records its token too (grants 0), on MySQL and PostgreSQL. The
// record is written on its own, before the release locks the name's row
// (see txs.recordGone): a request of the token either runs after the
// record is committed, or has run when the release locks the row and is
// seen and undone (a live shared hold found, the request's grant, takes
// the record with it). While the record lives, a request of the token is refused a
// grant (grants 1: the plain, fair and shared acquires) and records no
// queue entry, writer intent or claim (either kind), and the token's queue
// entry is passed over: a waiter that gave up holds the queue up only until
// its record is written. On PostgreSQL, whose
// single statements read what was committed when they began, a plain
// acquire or an intent that waited for the row's lock and finds it changed
// since (its xmin) is refused too ({fresh}); Backend.acquire then runs it
// once more, with a fresh snapshot.
//
// A request later than goneTTL after its clean-up is not refused: the lock
// it grants sits held by nobody for at most its TTL, its queue entry or
// intent for at most QueueTTL. A token that is used again (a reentrant
// handle's, an owner ID's) is refused grants for up to goneTTL after a
// clean-up release that found nothing, and queue places after a
// withdrawal.
//
// SQLite needs no record: its driver runs in the process, and a statement
// whose context ends has run or been interrupted when the call returns.
const goneTTL = 5 * time.Second

// recordsGone reports whether the Backend's dialect keeps the gone
// records (see goneTTL).
func (b *Backend) recordsGone() bool { return b.dialect != SQLite }

// Package chaos checks the safety of dlock locks from the outside: it runs
// workloads through the public API, records every operation with times on
// the host's monotonic clock, and checks the history.
//
// A run has four parts:
//
//   - a Recorder, which keeps the events;
//   - a Resource, the thing the locks protect (a stock count or a set per
//     lock name, in the test's memory), fenced or not; it stamps every access
//     on its own clock, so the order it served them is the order checked;
//   - Workers, one per dlock.Client, each running critical sections: take
//     the lock, read the resource, sleep, write what it read updated, unlock
//     (Run drives many at once; Step runs one); Observe wraps each client's
//     backend so that the store calls, background renewals included, are in
//     the history too;
//   - Check, which reads the history and reports, with counts: whether two
//     leases of one name were ever valid at once (exclusive, read-write and
//     semaphore rules), whether fences rose with every grant, whether the
//     resource accepted a stale fence, whether updates were lost or the stock
//     went below zero, whether each name's critical sections are linearizable
//     (github.com/anishathalye/porcupine), and whether every lost lease was
//     reported to its holder before its local deadline.
//
// A lease's window, the time its holder may trust it, runs from the moment
// its acquire returned to the first of Unlock being called, the loss being
// reported and its local deadline (lease.Deadline, or the later one a
// renewal recorded by Observe gave it, less CheckOptions.ClockSlack for the
// stores' millisecond clocks). Child processes record
// into the parent's Recorder and reach its Resource over HTTP
// (RemoteRecorder, RemoteResource): on Linux, times of every process on the
// host are on one clock.
//
// Faults are the caller's: stop a process, kill a store, cut the network,
// cancel contexts (Worker.CancelRate), skew a store's clock
// (WithStoreClockRate). The dlock repository runs named fault scenarios
// against every backend in internal/test/chaostest; docs/SAFETY.md lists them
// and their figures. Use this package the same way against your own store
// and faults: see the example.
package chaos

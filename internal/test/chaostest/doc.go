// Package chaostest verifies dlock's safety under faults, on every backend,
// with the checker of package locktest/chaos; its files are all tests.
//
// Each scenario is a test (TestBaseline, TestCancel, TestLatency,
// TestPartition, TestFair, the store faults, the faults at the direct
// handoff (TestFairNotifyDrop, TestHeadCrash), the gray faults
// (TestLateRequest, TestClientPause, TestHalfOpenPubSub, TestManyWaiters,
// TestLeaderChangeUnderLoad, TestFrozenFollower), and the child-process
// scenarios pause and crash) with one subtest per backend it applies to: memlock, redis
// (one node), redlock (three nodes, each behind a proxy), sqlite, mariadb
// and postgres, each on a real server started for the subtest (mariadb and
// postgres: a database of its own on a server the package's tests share,
// unless the scenario stops or kills the server). Several
// dlock clients, each with connections of its own as separate processes
// would have, run critical sections (the stock decrement: read the stock,
// think, write it one lower; or a set that grows by one member) on a
// resource that is fenced or not, while faults are injected: cancelled
// contexts, latency and partitions through toxiproxy, killed and restarted
// servers, connection kills, clock skew, paused and crashed processes.
// Every call is recorded with the host's monotonic clock, and the history
// is checked afterwards: exclusion, fencing, lost updates, linearizability
// (porcupine), losses reported in time, nothing left on the store, and, for
// the gray faults, no wait that ended with an error while it had time left
// and no name left free after a release, while somebody waited for it,
// longer than the fault's bound.
//
// Every run logs its counts in plain words, and the package prints a
// summary table at the end (shown with -v). A failed run writes its history,
// its report and porcupine's view to a directory it names.
//
//	go test -race -count=1 ./internal/test/chaostest/                     # every scenario, briefly
//	go test -race -count=1 -v ./internal/test/chaostest/ -run TestPartition
//	go test -count=1 -timeout 0 ./internal/test/chaostest/ -chaos.soak    # >= 10,000 critical sections each
//	go test -count=1 ./internal/test/chaostest/ -chaos.out /tmp/chaos     # where failure files go
package chaostest

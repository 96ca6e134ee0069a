// Package locktest is the conformance suite every dlock backend passes, in
// the way testing/fstest checks file systems. A backend's tests call Run with a
// factory that starts a fresh store for each case:
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, func(t *testing.T) *locktest.Store {
//			srv := startMyStore(t)
//			return &locktest.Store{
//				NewBackend: func(t *testing.T) driver.Backend { return mybackend.New(srv.Client(t)) },
//				Delete:     func(t *testing.T, key string) { srv.DeleteLock(t, key) },
//				Leftovers:  func(t *testing.T, key string) []string { return srv.KeysFor(t, key) },
//				Kill:       func(t *testing.T) { srv.Stop(t) },
//			}
//		})
//	}
//
// The suite works through the public dlock API with several Clients, each on
// a backend of its own, as separate processes would. Cases that depend on
// time use TTLs of a few hundred milliseconds; the whole suite takes some
// seconds.
//
// The cases on fair locks, read-write locks and semaphores run in full on a
// backend whose driver.Capabler reports the capability they need; on any
// other backend they check that the client refuses that lock kind with
// dlock.ErrInvalid. Stores without driver.Notifier pass them by polling.
package locktest

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
)

// Store is one fresh store for one test case, and the hooks the suite needs to
// act on it behind the client's back.
type Store struct {
	// NewBackend returns a new backend on the store. Each Client in a case
	// gets one, as if it ran in a process of its own. Required.
	NewBackend func(t *testing.T) driver.Backend
	// Delete removes the lock with the given key from the store without
	// going through the holder, as an operator or a store failure would.
	// Required.
	Delete func(t *testing.T, key string)
	// Leftovers returns what the store still holds for the lock with the
	// given key (keys, rows): holds of every mode, fair queue entries and
	// writer intents, leaving out what stores keep on purpose: the fence
	// counter, and records that expire by themselves without holding
	// anything back (Redis's ids of recent releases). Required.
	Leftovers func(t *testing.T, key string) []string
	// Kill makes the store stop answering for the rest of the case, for
	// example by stopping the server process. Required.
	Kill func(t *testing.T)
	// RevisionFences says that the store's fences are revisions of the
	// whole store (etcd), not a count of each name's grants: a grant's
	// fence is then only known to be above the last one's, and the
	// handoff cases read a handed grant's fence with the backend's
	// Inspector (which such a store must have) instead of requiring the
	// holder's fence + 1. Leave it false on any other store.
	RevisionFences bool
}

// Factory starts a fresh store for one test case and stops it in t.Cleanup.
type Factory func(t *testing.T) *Store

// Run runs the conformance suite, one subtest per property.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			if s == nil || s.NewBackend == nil || s.Delete == nil || s.Leftovers == nil || s.Kill == nil {
				t.Fatal("locktest: the factory must return a Store with every hook set")
			}
			c.fn(t, s)
		})
	}
}

type testCase struct {
	name string
	fn   func(t *testing.T, s *Store)
}

// cases lists the suite in the order it runs.
var cases = []testCase{
	{"MutualExclusion", testMutualExclusion},
	{"FencesIncrease", testFencesIncrease},
	{"HolderReported", testHolderReported},
	{"NonOwnerRefused", testNonOwnerRefused},
	{"ExpiryLetsAnotherIn", testExpiryLetsAnotherIn},
	{"AutoRenewKeepsLease", testAutoRenewKeepsLease},
	{"ManualRefresh", testManualRefresh},
	{"DeletedBehindHolder", testDeletedBehindHolder},
	{"OwnerIDRegranted", testOwnerIDRegranted},
	{"BreakIf", testBreakIf},
	{"StoreKilled", testStoreKilled},
	{"Reentrant", testReentrant},
	{"ReentrantSharedHandle", testReentrantSharedHandle},
	{"NotReentrantWaits", testNotReentrantWaits},
	{"SharedOwnerID", testSharedOwnerID},
	{"SharedOwnerShorterTTL", testSharedOwnerShorterTTL},
	{"ReentryAfterLoss", testReentryAfterLoss},
	{"StaleReentrantUnlock", testStaleReentrantUnlock},
	{"WokenByRelease", testWokenByRelease},
	{"OneClientManyWaiters", testOneClientManyWaiters},
	{"ManyWaitersOneClient", testManyWaitersOneClient},
	{"CancelledWaitLeavesNothing", testCancelledWaitLeavesNothing},
	{"WithWaitBoundsTheWait", testWithWait},
	{"UnlockAfterLoss", testUnlockAfterLoss},
	{"UnlockStopsRenewal", testUnlockStopsRenewal},
	{"Do", testDo},
	{"InvalidInput", testInvalidInput},
	{"CloseStopsEverything", testCloseStopsEverything},
	{"LockDelay", testLockDelay},
	{"FairOrder", testFairOrder},
	{"FairRWMutexBatch", testFairRWMutexBatch},
	{"FairWakesOnlyHead", testFairWakesOnlyHead},
	{"FairCancelledLeaves", testFairCancelledLeaves},
	{"FairDeadWaiterLeaves", testFairDeadWaiterLeaves},
	{"FairTryLockYields", testFairTryLockYields},
	{"GivenUpLeavesAtOnce", testGivenUpLeavesAtOnce},
	{"HandoffWithoutRequest", testHandoffWithoutRequest},
	{"HandoffNoticeLost", testHandoffNoticeLost},
	{"HandoffDeadHead", testHandoffDeadHead},
	{"HandoffCancelledHead", testHandoffCancelledHead},
	{"HandoffBreakIf", testHandoffBreakIf},
	{"RWReadersShare", testRWReadersShare},
	{"RWWriterExcludes", testRWWriterExcludes},
	{"RWWriterNotStarved", testRWWriterNotStarved},
	{"RWReaderCrashExpires", testRWReaderCrashExpires},
	{"RWFences", testRWFences},
	{"IntentMoves", testIntentMoves},
	{"ReleaseAcquire", testReleaseAcquire},
	{"SemaphoreLimit", testSemaphoreLimit},
	{"SemaphorePermitExpires", testSemaphorePermitExpires},
	{"SemaphoreLimitBinds", testSemaphoreLimitBinds},
	{"SemaphorePermitLeases", testSemaphorePermitLeases},
	{"SemaphoreWaitWokenByRelease", testSemaphoreWaitWokenByRelease},
	{"KindsLeaveNothing", testKindsLeaveNothing},
	{"KindsInvalid", testKindsInvalid},
	{"Election", testElection},
	{"Proclaim", testProclaim},
	{"Multi", testMulti},
	{"MultiAtOnce", testMultiAtOnce},
	{"MultiAtOnceCrossing", testMultiAtOnceCrossing},
}

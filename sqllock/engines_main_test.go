package sqllock_test

import (
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// Each engine's tests run under one top-level test that starts the engine
// once (a server takes a second or two); every subtest gets a fresh database
// of its own on it. None runs in parallel: locktest's CloseStopsEverything
// checks that no goroutine is left in the whole process.

func TestSQLite(t *testing.T) {
	runCommon(t, sqliteDatabases)
}

func TestMariaDB(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	newDB := mariadbDatabases(srv)
	runCommon(t, newDB)
	t.Run("FencesSurviveRestart", func(t *testing.T) { testFencesSurviveRestart(t, newDB, srv.Stop, srv.Start, srv.Kill) })
	t.Run("RenewBatchFallback", func(t *testing.T) { testRenewBatchFallback(t, newDB) })
	t.Run("AnswersArePerStatement", func(t *testing.T) { testMySQLAnswersPerStatement(t, newDB) })
	t.Run("Locking", func(t *testing.T) { testMySQLLocking(t, newDB) })
}

func TestPostgres(t *testing.T) {
	srv := testserver.StartPostgres(t)
	newDB := postgresDatabases(srv)
	runCommon(t, newDB)
	t.Run("FencesSurviveRestart", func(t *testing.T) { testFencesSurviveRestart(t, newDB, srv.Stop, srv.Start, srv.Kill) })
	t.Run("Notify", func(t *testing.T) { testNotify(t, newDB, srv) })
	t.Run("NotifyNext", func(t *testing.T) { testNotifyNext(t, newDB) })
	t.Run("ListenHeartbeat", func(t *testing.T) { testListenHeartbeat(t, newDB) })
	t.Run("ListenNeedsPgx", func(t *testing.T) { testListenNeedsPgx(t, newDB) })
	t.Run("ListenThroughWrapper", func(t *testing.T) { testListenThroughWrapper(t, newDB) })
	t.Run("ListenSmallPool", func(t *testing.T) { testListenSmallPool(t, newDB) })
}

// runCommon runs the tests every engine passes.
func runCommon(t *testing.T, newDB newDatabase) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, newDB newDatabase)
	}{
		{"Conformance", conformance},
		{"FirstGrant", testFirstGrant},
		{"Reentry", testReentry},
		{"HeldByAnother", testHeldByAnother},
		{"ExpiredRowTakenOver", testExpiredRowTakenOver},
		{"RenewNeverShortens", testRenewNeverShortens},
		{"RenewBatch", testRenewBatch},
		{"ExactNames", testExactNames},
		{"Inspector", testInspector},
		{"ListPrefix", testListPrefix},
		{"Tables", testTables},
		{"ConcurrentFirstUse", testConcurrentFirstUse},
		{"SharedExcludesExclusive", testSharedExcludesExclusive},
		{"SharedExpires", testSharedExpires},
		{"SemaphoreLimit", testSemaphoreLimit},
		{"WriterIntent", testWriterIntent},
		{"FairQueue", testFairQueue},
		{"FairPollTakesNoRowLock", testFairPollTakesNoRowLock},
		{"FairPollAnsweredAfterCtxEnds", testFairPollAnsweredAfterCtxEnds},
		{"FairBehindReaders", testFairBehindReaders},
		{"SharedRenew", testSharedRenew},
		{"SharedInspect", testSharedInspect},
		{"FencesAcrossKinds", testFencesAcrossKinds},
		{"SharedRequestsChecked", testSharedRequestsChecked},
		{"Upgrade", testUpgrade},
		{"SideTableNames", testSideTableNames},
		{"ConcurrentKinds", testConcurrentKinds},
		{"RoundTrips", testRoundTrips},
		{"PlainNotStarved", testPlainNotStarved},
		{"ClaimLeftOnCancel", testClaimLeftOnCancel},
		{"ClaimKeepsIntent", testClaimKeepsIntent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newDB) })
	}
}

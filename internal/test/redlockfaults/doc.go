// Package redlockfaults holds fault-injection tests and benchmarks of the
// redlock backend, and nothing else: its files are all tests.
//
// Each test starts several real redis-servers, each behind an in-process
// TCP proxy (testserver.StartProxy) that can refuse connections, swallow
// traffic without an answer or add latency, and runs several dlock clients
// that contend for a few names through the proxies while nodes fail, are
// partitioned, slowed, or killed and restarted. Every grant is recorded
// outside the library, from the moment Lock returned to the moment the holder
// stopped trusting it (Unlock called, Done closed, or the local validity
// deadline passed), and the tests check that no two grants of one name
// overlap and that fences grow in grant order.
//
//	go test -race -count=1 ./internal/test/redlockfaults/
//	go test -run XXX -bench . -benchtime 2s ./internal/test/redlockfaults/
package redlockfaults

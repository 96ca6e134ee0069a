package dash

import (
	"fmt"
	"io"
	"time"
)

// writeMetrics writes the Prometheus text exposition (format 0.0.4) of st,
// by hand: the dashboard needs a dozen lines, not a client library. No
// metric has a lock's name as a label (names are unbounded); the store is
// the target's, named by the scrape configuration.
func writeMetrics(w io.Writer, st State) {
	up := 0
	if st.Error == "" && st.SampledAt != "" {
		up = 1
	}
	g := func(name, help string, v any) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %v\n", name, help, name, name, v)
	}
	c := func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	g("dlock_dash_up", "1 when the last sample of the store succeeded, else 0.", up)
	g("dlock_locks_held", "Locks with an exclusive holder or shared holds, at the last good sample.", st.Totals.Locks)
	g("dlock_exclusive_holds", "Exclusive holds, at the last good sample.", st.Totals.Exclusive)
	g("dlock_shared_holds", "Shared holds (readers and semaphore permits), at the last good sample.", st.Totals.Shared)
	g("dlock_queued_waiters", "Waiters in the locks' queues, at the last good sample.", st.Totals.Queued)
	g("dlock_writers_waiting", "Read-write locks whose writer waits for the readers, at the last good sample.", st.Totals.WritersWaiting)
	g("dlock_locks_in_lock_delay", "Locks kept from others after their holder's lease expired unreleased, at the last good sample.", st.Totals.Delayed)
	c("dlock_dash_grants_total", "Grants seen by the sampler (a hold that appeared between two samples).", st.Counts.Grants)
	c("dlock_dash_releases_total", "Releases seen by the sampler (a hold that disappeared with time left on its lease).", st.Counts.Releases)
	c("dlock_dash_losses_total", "Losses seen by the sampler (a hold that expired unreleased).", st.Counts.Losses)
	c("dlock_dash_samples_total", "Samples of the store taken.", st.Counts.Samples)
	c("dlock_dash_sample_errors_total", "Samples of the store that failed.", st.Counts.SampleErrors)
	c("dlock_dash_wakeups_total", "Samples taken at once because the store announced a release (where it has notifications).", st.Counts.Wakeups)
	if t, err := time.Parse(time.RFC3339Nano, st.SampledAt); err == nil {
		fmt.Fprintf(w, "# HELP dlock_dash_last_sample_timestamp_seconds When the last sample was taken.\n# TYPE dlock_dash_last_sample_timestamp_seconds gauge\ndlock_dash_last_sample_timestamp_seconds %.3f\n", float64(t.UnixMilli())/1000)
	}
}

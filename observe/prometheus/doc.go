// Package prometheus exports what a dlock Client does as Prometheus
// metrics: a Collector that is both a dlock.Observer (give it to
// dlock.WithObserver) and a prometheus.Collector (register it).
//
// It is a module of its own, github.com/dlock-go/dlock/observe/prometheus,
// so that dlock's users who do not use Prometheus never download
// client_golang. Its name clashes with client_golang's package; import it
// under another name:
//
//	import dlockprom "github.com/dlock-go/dlock/observe/prometheus"
//
//	metrics := dlockprom.New()
//	prometheus.MustRegister(metrics)
//	c := dlock.New(backend, dlock.WithObserver(metrics))
//
// Every metric has the label store, the kind of store behind the Client
// (dlock.Event.Store: redis, postgres, ...). Lock names are unbounded, so
// they are no label unless WithLockLabel maps them to a few values.
// docs/OBSERVABILITY.md lists the metrics.
package prometheus

// Package otel reports what a dlock Client does through OpenTelemetry:
// metrics (the same as the Prometheus adapter's) through the metric API,
// and a span per Lock, TryLock, Unlock and Client.Do, with the time the lease was held
// as a span of its own that the lease's Context carries, so that work run
// under lease.Context() nests under it.
//
// It is a module of its own, github.com/dlock-go/dlock/observe/otel, so
// that dlock's users who do not use OpenTelemetry never download it. Its
// name clashes with go.opentelemetry.io/otel; import it under another name:
//
//	import dlockotel "github.com/dlock-go/dlock/observe/otel"
//
//	obs, err := dlockotel.New() // the global MeterProvider and TracerProvider
//	if err != nil { ... }
//	c := dlock.New(backend, dlock.WithObserver(obs))
//
// Every metric has the attribute dlock.store, the kind of store behind the
// Client (dlock.Event.Store). Lock names are unbounded, so they are no
// metric attribute unless
// WithLockName maps them to a few values; spans carry the full name.
// docs/OBSERVABILITY.md lists the instruments and spans.
package otel

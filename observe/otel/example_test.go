package otel_test

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
	dlockotel "github.com/dlock-go/dlock/observe/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func Example() {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter() // in a program: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)
	obs, err := dlockotel.New(dlockotel.WithTracerProvider(tp)) // metrics: the global MeterProvider
	if err != nil {
		fmt.Println(err)
		return
	}
	c := dlock.New(memlock.New(), dlock.WithObserver(obs))
	defer c.Close()

	ctx, request := tp.Tracer("app").Start(ctx, "request")
	lease, err := c.Mutex("orders:42").Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, work := tp.Tracer("app").Start(lease.Context(), "work") // nests under dlock.Hold
	work.End()
	if err := lease.Unlock(ctx); err != nil {
		fmt.Println(err)
	}
	request.End()

	byID := map[string]string{}
	for _, s := range spans.GetSpans() {
		byID[s.SpanContext.SpanID().String()] = s.Name
	}
	for _, s := range spans.GetSpans() {
		if parent, ok := byID[s.Parent.SpanID().String()]; ok {
			fmt.Printf("%s, in %s\n", s.Name, parent)
		} else {
			fmt.Println(s.Name)
		}
	}
	// Output:
	// dlock.Lock, in request
	// work, in dlock.Hold
	// dlock.Unlock, in dlock.Hold
	// dlock.Hold, in request
	// request
}

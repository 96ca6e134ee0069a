package prometheus_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
	dlockprom "github.com/dlock-go/dlock/observe/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

func Example() {
	ctx := context.Background()
	metrics := dlockprom.New(dlockprom.WithLockLabel(func(name string) string {
		group, _, _ := strings.Cut(name, ":") // "orders:42" -> "orders"
		return group
	}))
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(metrics)
	reg.MustRegister(metrics)
	c := dlock.New(memlock.New(), dlock.WithObserver(metrics))
	defer c.Close()

	lease, err := c.Mutex("orders:42").Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := lease.Unlock(ctx); err != nil {
		fmt.Println(err)
	}

	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() == "dlock_lock_grants_total" || f.GetName() == "dlock_leases" {
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				fmt.Println(f.GetName(), labels, v)
			}
		}
	}
	// Output:
	// dlock_leases [lock=orders store=memory type=mutex] 0
	// dlock_lock_grants_total [call=lock lock=orders store=memory type=mutex] 1
}

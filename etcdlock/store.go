package etcdlock

import "github.com/dlock-go/dlock/driver"

var _ driver.StoreNamer = (*Backend)(nil)

// StoreName returns "etcd" (driver.StoreNamer).
func (b *Backend) StoreName() string { return "etcd" }

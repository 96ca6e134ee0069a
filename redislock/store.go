package redislock

import "github.com/dlock-go/dlock/driver"

var _ driver.StoreNamer = (*Backend)(nil)

// StoreName returns "redis" (driver.StoreNamer), for one node, Sentinel
// and Cluster alike.
func (b *Backend) StoreName() string { return "redis" }

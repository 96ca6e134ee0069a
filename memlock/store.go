package memlock

import "github.com/dlock-go/dlock/driver"

var _ driver.StoreNamer = (*Backend)(nil)

// StoreName returns "memory" (driver.StoreNamer).
func (b *Backend) StoreName() string { return "memory" }

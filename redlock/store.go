package redlock

import "github.com/dlock-go/dlock/driver"

var _ driver.StoreNamer = (*Backend)(nil)

// StoreName returns "redlock" (driver.StoreNamer).
func (b *Backend) StoreName() string { return "redlock" }

package sqllock

import "github.com/dlock-go/dlock/driver"

var _ driver.StoreNamer = (*Backend)(nil)

// StoreName returns "mysql", "postgres" or "sqlite", by the Backend's
// Dialect (driver.StoreNamer).
func (b *Backend) StoreName() string {
	switch b.dialect {
	case MySQL:
		return "mysql"
	case PostgreSQL:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return "sql"
}

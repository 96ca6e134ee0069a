// Making the sqllock backend for an open SQL database.

package cli

import (
	"database/sql"
	"fmt"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// newSQLBackend makes the dlock backend on db: sqllock in the dialect d, and
// on PostgreSQL the variant that wakes waiters with LISTEN/NOTIFY.
func newSQLBackend(db *sql.DB, d sqlDialect) (driver.Backend, error) {
	switch d {
	case dialectSQLite:
		return sqllock.NewSQLite(db), nil
	case dialectMySQL:
		return sqllock.New(db, sqllock.MySQL), nil
	case dialectPostgres:
		return sqllock.NewPostgres(db), nil
	}
	return nil, fmt.Errorf("unknown SQL dialect %d", d)
}

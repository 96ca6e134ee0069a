package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqllock"
)

// A lock file that several processes on one host share.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "sqllock-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "locks.db")+
		"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	ctx := context.Background()
	c := dlock.New(sqllock.New(db, sqllock.SQLite))
	defer c.Close()
	for range 2 {
		lease, err := c.Mutex("nightly-report").Lock(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("fence", lease.Fence())
		_ = lease.Unlock(ctx)
	}
	// Output:
	// fence 1
	// fence 2
}

// The tables for a DBA to create, for a Backend made WithoutCreateTable.
func ExampleDDL() {
	ddl, err := sqllock.DDL(sqllock.PostgreSQL, "locks.dlock")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "locks"."dlock" (
	//   name         text COLLATE "C" NOT NULL PRIMARY KEY,
	//   token        text,
	//   owner        text NOT NULL,
	//   fence        bigint NOT NULL,
	//   holds        integer NOT NULL,
	//   acquired_at  timestamptz NOT NULL,
	//   expires_at   timestamptz NOT NULL,
	//   shared_until timestamptz,
	//   intent_token text,
	//   intent_owner text,
	//   intent_until timestamptz,
	//   claim_token  text,
	//   claim_owner  text,
	//   claim_until  timestamptz,
	//   shared_lim   integer,
	//   proclaimed   text
	// );
	//
	// CREATE TABLE IF NOT EXISTS "locks"."dlock_shared" (
	//   name        text COLLATE "C" NOT NULL,
	//   token       text COLLATE "C" NOT NULL,
	//   owner       text NOT NULL,
	//   fence       bigint NOT NULL,
	//   lim         integer NOT NULL,
	//   acquired_at timestamptz NOT NULL,
	//   expires_at  timestamptz NOT NULL,
	//   PRIMARY KEY (name, token)
	// );
	//
	// CREATE TABLE IF NOT EXISTS "locks"."dlock_queue" (
	//   name       text COLLATE "C" NOT NULL,
	//   token      text COLLATE "C" NOT NULL,
	//   seq        bigint NOT NULL,
	//   expires_at timestamptz NOT NULL,
	//   PRIMARY KEY (name, token)
	// );
	//
	// CREATE TABLE IF NOT EXISTS "locks"."dlock_gone" (
	//   name       text COLLATE "C" NOT NULL,
	//   token      text COLLATE "C" NOT NULL,
	//   grants     integer NOT NULL,
	//   expires_at timestamptz NOT NULL,
	//   PRIMARY KEY (name, token)
	// )
}

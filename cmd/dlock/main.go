// Command dlock runs commands under distributed locks and shows who holds
// them. Run "dlock help" for its commands and backends; the code is in
// internal/cli.
package main

import (
	"context"
	"os"

	"github.com/dlock-go/dlock/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

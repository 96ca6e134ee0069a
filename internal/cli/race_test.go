//go:build race

package cli_test

const raceEnabled = true

//go:build unix && !linux

package cli

// becomeSubreaper does nothing where there are no child subreapers; a killed
// process group is then gone once init has reaped its orphans.
func becomeSubreaper() {}

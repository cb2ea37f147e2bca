package testkit

import (
	"fmt"
	"os"
	"testing"
)

// Unavailable skips a test whose tool or privilege is missing here, except under CI=true: CI runs
// as root after scripts/setup-host.sh installed every tool, so there a missing one is a failure
// (a forgotten install step), not a quietly smaller test run.
func Unavailable(t testing.TB, format string, args ...interface{}) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: scripts/setup-host.sh installs it and CI runs as root)", why)
	}
	t.Skip(why)
}

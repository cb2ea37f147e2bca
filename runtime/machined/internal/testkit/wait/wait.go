// Package wait polls for a condition in tests. It imports nothing of machined's, so that
// the tests of the packages testkit itself imports (supervisor, safego) can use it too.
package wait

import (
	"testing"
	"time"
)

// Until polls cond every 20 ms and fails the test once max has passed without it holding;
// what names the condition in the failure.
func Until(t testing.TB, what string, max time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(max)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package safego

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/testkit/wait"
)

// capturePanics routes panic reports to a slice for one test.
func capturePanics(t *testing.T) func() []string {
	var mu sync.Mutex
	var lines []string
	setPanicLogger(func(format string, args ...interface{}) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmtLine(format, args...))
	})
	t.Cleanup(func() { setPanicLogger(func(string, ...interface{}) {}) })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

func fmtLine(format string, args ...interface{}) string {
	return strings.TrimSpace(strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " "))
}

func TestGoSafeRecoversAndReports(t *testing.T) {
	got := capturePanics(t)
	var wg sync.WaitGroup
	wg.Add(1)
	Go("test worker", func() {
		defer wg.Done()
		var m map[string]int
		m["boom"] = 1 // a nil map write: a runtime panic, as a parser bug would be
	})
	wg.Wait()
	wait.Until(t, "the panic report", time.Second, func() bool { return len(got()) == 1 })
	line := got()[0]
	for _, want := range []string{"machined: panic in test worker:", "assignment to entry in nil map", "stack:", "safego_test.go"} {
		if !strings.Contains(line, want) {
			t.Errorf("report %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "\n") {
		t.Errorf("the report is more than one line: %q", line)
	}
	// the process (this test) is still here, and runSafe says whether fn panicked
	if runSafe("quiet", func() {}) || !runSafe("loud", func() { panic("x") }) {
		t.Fatal("runSafe misreports")
	}
}

func TestGoForeverRestartsThenGivesUp(t *testing.T) {
	got := capturePanics(t)
	old := restartDelay
	restartDelay = func(int) time.Duration { return time.Millisecond }
	t.Cleanup(func() { restartDelay = old })

	var mu sync.Mutex
	runs := 0
	Forever("flaky loop", func() {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		if n < 3 {
			panic("transient")
		}
	})
	wait.Until(t, "a third, clean run", time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return runs == 3 })
	if n := len(got()); n != 2 {
		t.Fatalf("%d reports, want 2: %v", n, got())
	}

	Forever("broken loop", func() { panic("always") })
	wait.Until(t, "the component marked failed", 2*time.Second, func() bool {
		l := got()
		return len(l) > 0 && strings.Contains(l[len(l)-1], "broken loop panicked 11 times; it is marked failed")
	})
}

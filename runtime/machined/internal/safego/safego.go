// Package safego starts machined's goroutines.
//
// As PID 1, a panic anywhere that reaches the top of a goroutine ends machined and the
// kernel panics with it ("Attempted to kill init!"). So every goroutine machined starts
// goes through Go or Forever, which recover, say what happened on one console line
// with the stack, and keep the machine up (a failed component rather than a dead machine).
// Go's fatal errors (out of memory, concurrent map writes) cannot be recovered.
package safego

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

var (
	panicMu  sync.Mutex
	panicSay = func(format string, args ...interface{}) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
)

// setPanicLogger routes panic reports to the console once there is one.
func setPanicLogger(say func(string, ...interface{})) {
	panicMu.Lock()
	defer panicMu.Unlock()
	panicSay = say
}

func reportPanic(name string, value interface{}, stack []byte) {
	panicMu.Lock()
	say := panicSay
	panicMu.Unlock()
	say("machined: panic in %s: %v; stack: %s", name, value, OneLineStack(stack))
}

// OneLineStack folds a goroutine's stack into one line (frames separated by " < ") so the
// report stays one console line and one entry of the machined log.
func OneLineStack(stack []byte) string {
	var frames []string
	for _, l := range strings.Split(strings.TrimSpace(string(stack)), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "goroutine ") {
			frames = append(frames, l)
		}
	}
	return strings.Join(frames, " < ")
}

// runSafe runs fn and reports whether it panicked (the panic itself is recovered and reported).
func runSafe(name string, fn func()) (panicked bool) {
	defer func() {
		if r := recover(); r != nil {
			reportPanic(name, r, debug.Stack())
			panicked = true
		}
	}()
	fn()
	return false
}

// Go starts fn in a goroutine whose panic is recovered and reported; the goroutine
// then ends (its deferred calls, such as a WaitGroup's Done, have run).
func Go(name string, fn func()) {
	go runSafe(name, fn)
}

// Forever starts a long-lived loop (the reaper, signal handling, a DHCP client) and starts
// it again after a panic, waiting restartDelay(n) before the n-th restart, so one bad input
// cannot stop the machine from reaping or renewing. After maxRestarts panics the component
// is reported failed and left stopped: a loop that panics at once every time is not retried
// forever. fn returning normally ends it.
func Forever(name string, fn func()) {
	go func() {
		for n := 1; runSafe(name, fn); n++ {
			if n > maxRestarts {
				reportFailed(name)
				return
			}
			time.Sleep(restartDelay(n))
		}
	}()
}

const maxRestarts = 10

// restartDelay grows from 100 ms to 10 s; a variable so tests need not wait.
var restartDelay = func(n int) time.Duration {
	d := 100 * time.Millisecond << uint(n-1)
	if d > 10*time.Second || d <= 0 {
		d = 10 * time.Second
	}
	return d
}

func reportFailed(name string) {
	panicMu.Lock()
	say := panicSay
	panicMu.Unlock()
	say("machined: %s panicked %d times; it is marked failed and not restarted", name, maxRestarts+1)
}

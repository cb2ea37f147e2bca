package testkit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// RunUntilStopped runs run (a Run loop) on its own goroutine until stop is called or the test
// ends, whichever comes first: stop cancels run's context and fails the test unless run
// returns within the given time.
func RunUntilStopped(t testing.TB, within time.Duration, run func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	go func() { run(ctx); close(finished) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-finished:
			case <-time.After(within):
				t.Errorf("Run did not return within %s after its context ended", within)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

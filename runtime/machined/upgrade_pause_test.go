package main

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// kiln.test=pause:STEP names the step with '-' for spaces; any other step passes at once.
func TestPauseStepComesFromKilnTest(t *testing.T) {
	for value, want := range map[string]string{"pause:wrote-B/vmlinuz": "wrote-B/vmlinuz", "crash": "", "": "", "pause:": ""} {
		if got := pauseStep(map[string]string{paramTest: value}); got != want {
			t.Errorf("kiln.test=%s: step %q, want %q", value, got, want)
		}
	}
}

func TestPauseAtBlocksOnlyAtItsStep(t *testing.T) {
	var mu sync.Mutex
	var said []string
	say := func(f string, a ...interface{}) {
		mu.Lock()
		defer mu.Unlock()
		said = append(said, fmt.Sprintf(f, a...))
	}
	for _, step := range []string{"removed B/boot.cfg", "wrote B/initramfs.zst", "pulled"} {
		pauseAt("wrote-B/vmlinuz", step, say) // returns: not the step
		pauseAt("", step, say)
	}
	done := make(chan struct{})
	go func() {
		pauseAt("wrote-B/vmlinuz", "wrote B/vmlinuz", say)
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(said)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	got := said
	mu.Unlock()
	if len(got) != 1 || got[0] != "test: paused after wrote B/vmlinuz, for a power cut" {
		t.Fatalf("said %q", got)
	}
	select {
	case <-done:
		t.Fatal("pauseAt returned at its own step")
	case <-time.After(200 * time.Millisecond):
	}
}

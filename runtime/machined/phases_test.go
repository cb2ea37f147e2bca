package main

import (
	"strings"
	"testing"
	"time"
)

func TestPhasesNameEachPartOnce(t *testing.T) {
	var p phases
	p.mark("start")
	time.Sleep(2 * time.Millisecond)
	p.mark("modules")
	p.mark("network")
	line := p.describe(1500 * time.Millisecond)
	if !strings.HasPrefix(line, "ready 1.50s after the kernel started (modules ") || !strings.Contains(line, ", network 0.00s)") {
		t.Fatalf("unexpected line %q", line)
	}
	if strings.Contains(line, "start 0") {
		t.Fatalf("the first mark only starts: %q", line)
	}
	if got := (&phases{}).describe(0); got != "ready ()" {
		t.Fatalf("empty phases: %q", got)
	}
}

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// phases times the parts of a boot, so the console says where the seconds to ready went
// (the boot benchmark and anyone chasing a slow boot read it).
type phases struct {
	last  time.Time
	names []string
	took  []time.Duration
}

// mark ends the phase called name, begun at the previous mark (the first mark only starts).
func (p *phases) mark(name string) {
	now := time.Now()
	if !p.last.IsZero() {
		p.names = append(p.names, name)
		p.took = append(p.took, now.Sub(p.last))
	}
	p.last = now
}

// describe is one line: the kernel's uptime at ready (when known) and each phase's share.
func (p *phases) describe(uptime time.Duration) string {
	parts := make([]string, len(p.names))
	for i, name := range p.names {
		parts[i] = fmt.Sprintf("%s %.2fs", name, p.took[i].Seconds())
	}
	head := "ready"
	if uptime > 0 {
		head = fmt.Sprintf("ready %.2fs after the kernel started", uptime.Seconds())
	}
	return head + " (" + strings.Join(parts, ", ") + ")"
}

// uptime is /proc/uptime's first field; 0 when unreadable.
func uptime() time.Duration {
	data, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0
	}
	seconds, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || seconds < 0 {
		return 0
	}
	return time.Duration(seconds * float64(time.Second))
}

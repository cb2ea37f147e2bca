package supervisor

import (
	"bytes"
	"sync"
)

// RingLog keeps the last lines a service wrote, bounded by both line count and bytes, so
// a chatty service cannot eat the memory of a machine whose /var may be a tmpfs.
type RingLog struct {
	mu       sync.Mutex
	lines    []string
	start    int // index of the oldest line in lines once it has wrapped
	bytes    int
	maxLines int
	maxBytes int
	partial  []byte // a line still waiting for its newline
}

// NewRingLog returns an empty log bounded by maxLines lines and maxBytes bytes.
func NewRingLog(maxLines, maxBytes int) *RingLog {
	return &RingLog{maxLines: maxLines, maxBytes: maxBytes}
}

// Write splits p into lines; it never fails, so it can sit behind an io.MultiWriter.
func (r *RingLog) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	data := p
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			r.partial = append(r.partial, data...)
			if len(r.partial) > 4096 { // a line with no end: keep it, in pieces
				r.add(string(r.partial))
				r.partial = nil
			}
			break
		}
		line := string(append(r.partial, data[:i]...))
		r.partial = nil
		r.add(line)
		data = data[i+1:]
	}
	return len(p), nil
}

func (r *RingLog) add(line string) {
	if len(r.lines) < r.maxLines {
		r.lines = append(r.lines, line)
	} else {
		r.bytes -= len(r.lines[r.start])
		r.lines[r.start] = line
		r.start = (r.start + 1) % len(r.lines)
	}
	r.bytes += len(line)
	for r.bytes > r.maxBytes && r.count() > 1 {
		r.dropOldest()
	}
}

func (r *RingLog) count() int { return len(r.lines) }

func (r *RingLog) dropOldest() {
	ordered := r.ordered()
	r.bytes -= len(ordered[0])
	r.lines = ordered[1:]
	r.start = 0
}

func (r *RingLog) ordered() []string {
	out := make([]string, 0, len(r.lines))
	out = append(out, r.lines[r.start:]...)
	return append(out, r.lines[:r.start]...)
}

// Lines returns the kept lines, oldest first.
func (r *RingLog) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ordered()
	if len(r.partial) > 0 {
		out = append(out, string(r.partial))
	}
	return out
}

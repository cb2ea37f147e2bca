package testkit

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
)

// SyncBuffer is a log that goroutines (a server's, a child's output copier) write while the
// test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Lines collects formatted lines (what a fake was asked to do, what code under test
// reported) from any goroutine.
type Lines struct {
	mu    sync.Mutex
	lines []string
}

// Add appends one line.
func (l *Lines) Add(format string, args ...interface{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// All returns the lines so far.
func (l *Lines) All() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// Join returns the lines so far, joined by sep.
func (l *Lines) Join(sep string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, sep)
}

// Take returns the lines so far joined by "; " and forgets them.
func (l *Lines) Take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.lines, "; ")
	l.lines = nil
	return s
}

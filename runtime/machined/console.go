package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"

	"kiln/machined/internal/supervisor"
)

// console writes machined's own lines to /dev/console and to stdout, once each place:
// when stdout already is the console (the kernel hands PID 1 the console as fds 0-2),
// writing to both would show every line twice, and the ready line must appear once.
type console struct {
	mu      sync.Mutex
	console *os.File
	stdout  *os.File
	log     *supervisor.RingLog // machined's own log, served by the API as service "machined"
}

func newConsole(stdout *os.File) *console {
	c := &console{stdout: stdout, log: supervisor.NewRingLog(2000, 256<<10)}
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY|syscall.O_NOCTTY, 0); err == nil {
		if sameCharDevice(f, stdout) {
			f.Close()
		} else {
			c.console = f
		}
	}
	return c
}

func sameCharDevice(a, b *os.File) bool {
	var sa, sb syscall.Stat_t
	if b == nil || syscall.Fstat(int(a.Fd()), &sa) != nil || syscall.Fstat(int(b.Fd()), &sb) != nil {
		return false
	}
	return sa.Mode&syscall.S_IFMT == syscall.S_IFCHR && sa.Rdev == sb.Rdev && sb.Mode&syscall.S_IFMT == syscall.S_IFCHR
}

// line writes one raw line everywhere (the ready line goes through here unprefixed).
func (c *console) line(text string) {
	text = strings.TrimRight(text, "\n") + "\n"
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log.Write([]byte(text))
	if c.console != nil {
		_, _ = c.console.WriteString(text)
	}
	if c.stdout != nil {
		_, _ = c.stdout.WriteString(text)
	}
}

// printf writes one "machined: ..." line.
func (c *console) printf(format string, args ...interface{}) {
	c.line("machined: " + fmt.Sprintf(format, args...))
}

// claimStdio points fds 0-2 at /dev/null and the console. The kernel gives PID 1 the
// console only if the initramfs had a /dev/console node; if fds 0-2 were closed, the
// next files machined opened would get those numbers and its stdout would land in them.
func claimStdio() {
	if null, err := syscall.Open("/dev/null", syscall.O_RDWR|syscall.O_CLOEXEC, 0); err == nil {
		_ = syscall.Dup3(null, 0, 0)
		if null != 0 {
			syscall.Close(null)
		}
	}
	out, err := syscall.Open("/dev/console", syscall.O_WRONLY|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		out, err = syscall.Open("/dev/null", syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	}
	if err == nil {
		_ = syscall.Dup3(out, 1, 0)
		_ = syscall.Dup3(out, 2, 0)
		if out > 2 {
			syscall.Close(out)
		}
	}
}

package supervisor

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"kiln/machined/internal/safego"
)

// Reaper collects the exit status of machined's children.
//
// As PID 1 machined inherits every orphan, so one goroutine reaps all children with
// wait4(-1). exec.Cmd.Wait would race with it for the same exit statuses, so every child
// machined starts goes through the reaper instead: Start registers the pid under the
// lock the reaper needs to deliver a status, so an exit is never lost or misdelivered.
type Reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

var (
	theReaper     *Reaper
	theReaperOnce sync.Once
)

// Children returns the process-wide reaper, starting it on first use.
func Children() *Reaper {
	theReaperOnce.Do(func() {
		theReaper = &Reaper{waiters: map[int]chan syscall.WaitStatus{}}
		sigchld := make(chan os.Signal, 1)
		signal.Notify(sigchld, syscall.SIGCHLD)
		safego.Forever("reaper", func() {
			for {
				theReaper.sweep()
				<-sigchld
			}
		})
	})
	return theReaper
}

// sweep collects every exited child; those nobody waits for are orphans and are dropped.
func (r *Reaper) sweep() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		ch, ok := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if ok {
			ch <- status
		}
	}
}

// Start starts cmd and returns a channel that gets its wait status. The caller must not
// call cmd.Wait. Output goes where cmd.Stdout/Stderr say; they must be *os.File or nil so
// exec starts no copying goroutines that only Wait would collect.
func (r *Reaper) Start(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[cmd.Process.Pid] = ch
	return ch, nil
}

// StartPiped starts cmd with stdout and stderr on one pipe, returned for reading; the
// caller reads it to its end and must not call cmd.Wait.
func (r *Reaper) StartPiped(cmd *exec.Cmd) (io.ReadCloser, <-chan syscall.WaitStatus, error) {
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = wr, wr
	done, err := r.Start(cmd)
	wr.Close() // the child holds its own copy; EOF comes when it (and its children) close it
	if err != nil {
		rd.Close()
		return nil, nil, err
	}
	return rd, done, nil
}

// Run runs a command to completion and returns its combined output; a non-zero exit is an
// error that carries the output's last line, which is what a console line needs.
func Run(name string, args ...string) (string, error) {
	return RunInput(nil, name, args...)
}

// RunInput is Run with stdin fed from input.
func RunInput(input []byte, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = BaseEnv()
	if input != nil {
		f, err := inputFile(input)
		if err != nil {
			return "", err
		}
		defer f.Close()
		cmd.Stdin = f
	}
	out, done, err := Children().StartPiped(cmd)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	_, _ = io.Copy(&buf, out)
	out.Close()
	status := <-done
	text := buf.String()
	if !status.Exited() || status.ExitStatus() != 0 {
		return text, fmt.Errorf("%s: %s%s", name, DescribeExit(status), lastLine(text))
	}
	return text, nil
}

// inputFile returns a readable file holding input: a pipe when it fits the pipe's buffer
// (always, for the sfdisk scripts this is for), so no goroutine has to feed it.
func inputFile(input []byte) (*os.File, error) {
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer wr.Close()
	if len(input) > 60000 {
		rd.Close()
		return nil, fmt.Errorf("command input too large (%d bytes)", len(input))
	}
	if _, err := wr.Write(input); err != nil {
		rd.Close()
		return nil, err
	}
	return rd, nil
}

// DescribeExit says how a child ended: "exit status 3", or "killed by " and the signal.
func DescribeExit(status syscall.WaitStatus) string {
	if status.Signaled() {
		return "killed by " + status.Signal().String()
	}
	return fmt.Sprintf("exit status %d", status.ExitStatus())
}

func lastLine(text string) string {
	text = strings.TrimSpace(text)
	if i := strings.LastIndexByte(text, '\n'); i >= 0 {
		text = text[i+1:]
	}
	if text == "" {
		return ""
	}
	return ": " + text
}

// BaseEnv is the environment every child starts from (PID 1 gets almost none from the kernel).
func BaseEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/", "TERM=linux"}
}

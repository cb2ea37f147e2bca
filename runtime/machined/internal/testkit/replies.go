package testkit

import (
	"errors"
	"time"
)

// Replies is a fake server's answers waiting for a client's transport, in the tests of
// internal/dhcp's and internal/dhcp6's clients: both send, then wait for an answer until a
// deadline.
type Replies struct{ queue [][]byte }

// Add queues answers, in the order the client will receive them.
func (r *Replies) Add(answers ...[]byte) { r.queue = append(r.queue, answers...) }

// Receive is a transport's Receive: the first answer waiting, else a timeout after waitUntil
// moved the test's fake clock to the deadline, so that no test waits in real time.
func (r *Replies) Receive(deadline time.Time, waitUntil func(time.Time)) ([]byte, error) {
	if len(r.queue) > 0 {
		b := r.queue[0]
		r.queue = r.queue[1:]
		return b, nil
	}
	waitUntil(deadline)
	return nil, errors.New("timeout")
}

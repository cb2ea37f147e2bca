package dhcp6

import (
	"bytes"
	"context"
	"math/rand"
	"net"
	"strings"
	"testing"
	"time"
)

type event struct {
	what string
	at   time.Duration
}

// run runs a client against answer until stop says so, recording the hooks' calls with
// the fake time since the start.
func run(t *testing.T, answer func(s *fakeServer, m message) [][]byte, stop func(events []string) bool) ([]string, *fakeServer) {
	t.Helper()
	clk := &fakeClock{now: epoch}
	srv := &fakeServer{clk: clk}
	srv.answer = func(m message) [][]byte { return answer(srv, m) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events []string
	note := func(s string) {
		events = append(events, s+" @"+clk.now.Sub(epoch).Round(time.Second).String())
		if stop(events) || len(events) > 100 || clk.now.Sub(epoch) > 24*time.Hour {
			cancel()
		}
	}
	c := &Client{MAC: testMAC, Open: srv.open, Clock: clk, Rand: rand.New(rand.NewSource(1)), Hooks: Hooks{
		State: func(s State) { note(s.String()) },
		Bound: func(l Lease, renewed bool) {
			note("bound " + l.IP.String() + map[bool]string{true: " renewed"}[renewed])
		},
		Lost: func(l Lease, reason string) { note("lost " + l.IP.String() + ": " + reason) },
	}}
	c.Run(ctx)
	return events, srv
}

// A server that answers everything: SOLICIT, REQUEST, then RENEW at T1 (60 s) again and again.
func TestClientAcquiresAndRenews(t *testing.T) {
	events, srv := run(t, func(s *fakeServer, m message) [][]byte {
		switch m.msgType {
		case msgSolicit:
			return [][]byte{serverMsg(msgAdvertise, m.xid, goodLease(testIP)...)}
		case msgRequest, msgRenew:
			return [][]byte{serverMsg(msgReply, m.xid, goodLease(testIP)...)}
		}
		return nil
	}, func(ev []string) bool { return strings.Count(strings.Join(ev, "|"), "renewed") == 2 })
	want := "init @0s|requesting @0s|bound 2001:db8::100 @0s|bound @0s|renewing @1m0s|bound 2001:db8::100 renewed @1m0s|bound @1m0s|" +
		"renewing @2m0s|bound 2001:db8::100 renewed @2m0s|bound @2m0s"
	if got := strings.Join(events, "|"); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
	types := []byte{}
	for _, m := range srv.sent {
		types = append(types, m.msgType)
		if !bytes.Equal(m.get(optClientID), testDUID) || m.get(optORO) == nil || m.get(optElapsedTime) == nil || m.get(optIANA) == nil {
			t.Errorf("message %d lacks the client id, ORO, elapsed time or IA_NA: %+v", m.msgType, m)
		}
		if want := m.msgType == msgRequest || m.msgType == msgRenew; want != bytes.Equal(m.get(optServerID), serverDUID) {
			t.Errorf("message %d: server id %x", m.msgType, m.get(optServerID))
		}
		if m.msgType != msgSolicit && !bytes.Contains(m.get(optIANA), testIP.To16()) {
			t.Errorf("message %d does not name the address", m.msgType)
		}
	}
	if string(types) != string([]byte{msgSolicit, msgRequest, msgRenew, msgRenew}) {
		t.Errorf("sent %v", types)
	}
}

// The server goes silent after the lease: RENEW from T1 to T2, REBIND from T2 to the end of
// the valid lifetime, then the address is lost and the client solicits again.
func TestClientRebindsThenLosesTheLease(t *testing.T) {
	leases := 0
	events, srv := run(t, func(s *fakeServer, m message) [][]byte {
		switch {
		case m.msgType == msgSolicit && leases == 0:
			return [][]byte{serverMsg(msgAdvertise, m.xid, goodLease(testIP)...)}
		case m.msgType == msgRequest:
			leases++
			return [][]byte{serverMsg(msgReply, m.xid, goodLease(testIP)...)}
		}
		return nil
	}, func(ev []string) bool { return strings.HasPrefix(ev[len(ev)-1], "init") && len(ev) > 4 })
	want := "init @0s|requesting @0s|bound 2001:db8::100 @0s|bound @0s|renewing @1m0s|rebinding @1m45s|lost 2001:db8::100: expired @2m0s|init @2m0s"
	if got := strings.Join(events, "|"); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
	var renews, rebinds int
	for _, m := range srv.sent {
		switch m.msgType {
		case msgRenew:
			renews++
		case msgRebind:
			rebinds++
			if m.get(optServerID) != nil {
				t.Error("REBIND must not name a server")
			}
		}
	}
	if renews < 2 || rebinds < 1 {
		t.Errorf("%d RENEWs, %d REBINDs", renews, rebinds)
	}
}

// A renewal answered with NoBinding ends the lease at once; one answered with UnspecFail
// is ignored and asked again; one from another server is not ours; a REPLY that moves the
// address replaces it.
func TestClientRenewalAnswers(t *testing.T) {
	other := []byte{0, 3, 0, 1, 9, 9, 9, 9, 9, 9}
	moved := net.ParseIP("2001:db8::200")
	renewals := 0
	events, _ := run(t, func(s *fakeServer, m message) [][]byte {
		switch m.msgType {
		case msgSolicit:
			return [][]byte{serverMsg(msgAdvertise, m.xid, ia(iaid(testMAC), 0, 0, statusOpt(statusNoAddrsAvail, ""))),
				serverMsg(msgAdvertise, m.xid+1, goodLease(testIP)...), serverMsg(msgAdvertise, m.xid, goodLease(testIP)...)}
		case msgRequest:
			return [][]byte{serverMsg(msgReply, m.xid, goodLease(testIP)...)}
		case msgRenew:
			renewals++
			notOurs := message{msgType: msgReply, xid: m.xid, options: append([]option{{optClientID, testDUID}, {optServerID, other}},
				ia(iaid(testMAC), 0, 0, statusOpt(statusNoBinding, "")))}.marshal()
			if renewals == 1 {
				return [][]byte{notOurs, serverMsg(msgReply, m.xid, statusOpt(statusUnspecFail, "busy")),
					serverMsg(msgReply, m.xid, goodLease(moved)...)}
			}
			return [][]byte{serverMsg(msgReply, m.xid, ia(iaid(testMAC), 0, 0, statusOpt(statusNoBinding, "")))}
		}
		return nil
	}, func(ev []string) bool { return strings.HasPrefix(ev[len(ev)-1], "lost") })
	want := "init @0s|requesting @0s|bound 2001:db8::100 @0s|bound @0s|renewing @1m0s|bound 2001:db8::200 renewed @1m0s|bound @1m0s|" +
		"renewing @2m0s|lost 2001:db8::200: ended by the server: NoBinding @2m0s|init @2m0s"
	if got := strings.Join(events, "|"); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
}

// No server: SOLICITs back off to two minutes apart and keep going, quietly.
func TestClientSolicitsWithBackoff(t *testing.T) {
	var sent []time.Duration
	clkStart := epoch
	_, srv := run(t, func(s *fakeServer, m message) [][]byte {
		sent = append(sent, s.clk.now.Sub(clkStart))
		return nil
	}, func(ev []string) bool { return len(ev) >= 4 })
	if len(sent) < 10 || srv.opens < 3 {
		t.Fatalf("%d SOLICITs over %d sockets", len(sent), srv.opens)
	}
	gap := sent[len(sent)-1] - sent[len(sent)-2]
	if sent[1] < 900*time.Millisecond || sent[1] > 1100*time.Millisecond || gap < 100*time.Second || gap > 140*time.Second {
		t.Errorf("SOLICITs at %v", sent)
	}
}

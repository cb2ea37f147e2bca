package dhcp6

import (
	"encoding/binary"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

func TestMessageRoundTripAndClientOptions(t *testing.T) {
	c := &Client{MAC: testMAC, duid: duidLL(testMAC), iaid: iaid(testMAC)}
	m := message{msgType: msgSolicit, xid: 0xabcdef, options: []option{{optClientID, c.duid}, iaNA(c.iaid, nil), oro(), elapsed(0)}}
	got, err := parseMessage(m.marshal())
	if err != nil || got.msgType != msgSolicit || got.xid != 0xabcdef || len(got.options) != 4 {
		t.Fatalf("%+v %v", got, err)
	}
	if string(got.get(optClientID)) != string(testDUID) {
		t.Errorf("DUID-LL %x", got.get(optClientID))
	}
	if v := got.get(optIANA); len(v) != 12 || binary.BigEndian.Uint32(v) != 0x00123456 {
		t.Errorf("IA_NA %x", v)
	}
	if v := got.get(optORO); string(v) != "\x00\x17\x00\x38\x00\x1f" {
		t.Errorf("ORO %x", v)
	}
	if v := got.get(optElapsedTime); string(v) != "\x00\x00" {
		t.Errorf("elapsed %x", v)
	}
	if v := elapsed(int64(1500 * time.Millisecond)).value; binary.BigEndian.Uint16(v) != 150 {
		t.Errorf("1.5 s elapsed: %x", v)
	}
	if v := elapsed(int64(time.Hour)).value; binary.BigEndian.Uint16(v) != 0xffff {
		t.Errorf("an hour elapsed: %x", v)
	}
	ask := iaNA(7, testIP).value
	if len(ask) != 12+4+24 || !net.IP(ask[16:32]).Equal(testIP) {
		t.Errorf("IA_NA asking for an address: %x", ask)
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, {7, 0, 0, 1, 0, 1, 0, 5, 1}, {7, 0, 0, 1, 0}} {
		if _, err := parseMessage(bad); err == nil {
			t.Errorf("%x parsed", bad)
		}
	}
}

func TestLeaseFromReply(t *testing.T) {
	ntp := option{optNTPServer, appendOptions(nil, []option{{ntpSubAddr, net.ParseIP("2001:db8::123")}, {3, []byte("\x03ntp\x00")}})}
	m, _ := parseMessage(serverMsg(msgReply, 1, append(goodLease(testIP), ntp)...))
	l, err := leaseFrom(m, iaid(testMAC), epoch)
	if err != nil {
		t.Fatal(err)
	}
	if !l.IP.Equal(testIP) || l.IPNet().String() != "2001:db8::100/128" || l.T1 != time.Minute || l.T2 != 105*time.Second ||
		l.Valid != 2*time.Minute || l.Expiry() != epoch.Add(2*time.Minute) || len(l.DNS) != 1 || !l.DNS[0].Equal(testDNS) ||
		len(l.NTP) != 1 || l.NTP[0].String() != "2001:db8::123" || l.Server() != "0001000101020304aabbccddeeff" {
		t.Errorf("%+v", l)
	}
	cases := []struct {
		name string
		opts []option
		want string
	}{
		{"top-level status", append(goodLease(testIP), statusOpt(statusNoAddrsAvail, "none left")), "NoAddrsAvail"},
		{"IA status", []option{ia(iaid(testMAC), 0, 0, statusOpt(statusNoBinding, ""))}, "NoBinding"},
		{"T1 after T2", []option{ia(iaid(testMAC), 100, 50, iaAddr(testIP, 120, 120))}, "T1"},
		{"another IAID", []option{ia(99, 0, 0, iaAddr(testIP, 120, 120))}, "no usable address"},
		{"link-local", []option{ia(iaid(testMAC), 0, 0, iaAddr(net.ParseIP("fe80::1"), 120, 120))}, "no usable address"},
		{"valid 0", []option{ia(iaid(testMAC), 0, 0, iaAddr(testIP, 0, 0))}, "no usable address"},
		{"preferred after valid", []option{ia(iaid(testMAC), 0, 0, iaAddr(testIP, 200, 100))}, "no usable address"},
		{"address status", []option{ia(iaid(testMAC), 0, 0, iaAddr(testIP, 120, 120, statusOpt(statusNotOnLink, "")))}, "no usable address"},
	}
	for _, c := range cases {
		m, _ := parseMessage(serverMsg(msgReply, 1, c.opts...))
		if _, err := leaseFrom(m, iaid(testMAC), epoch); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	var se statusError
	m, _ = parseMessage(serverMsg(msgReply, 1, ia(iaid(testMAC), 0, 0, statusOpt(statusNoBinding, ""))))
	if _, err := leaseFrom(m, iaid(testMAC), epoch); !errors.As(err, &se) || !se.refusal() {
		t.Errorf("NoBinding must end the binding: %v", err)
	}
	// no T1/T2 from the server, infinite lifetimes: half and four fifths of the (capped) preferred lifetime
	m, _ = parseMessage(serverMsg(msgReply, 1, ia(iaid(testMAC), 0, 0, iaAddr(testIP, 0xffffffff, 0xffffffff))))
	if l, err := leaseFrom(m, iaid(testMAC), epoch); err != nil || l.Valid != maxLifetime || l.T1 != maxLifetime/2 || l.T2 != maxLifetime*4/5 {
		t.Errorf("%+v %v", l, err)
	}
	// a tiny lease still leaves time between the renewals
	m, _ = parseMessage(serverMsg(msgReply, 1, ia(iaid(testMAC), 1, 2, iaAddr(testIP, 3, 3))))
	if l, err := leaseFrom(m, iaid(testMAC), epoch); err != nil || l.Valid != minLease || l.T1 != minRenew || l.T2 != minRenew {
		t.Errorf("%+v %v", l, err)
	}
	m, _ = parseMessage(message{msgType: msgReply, options: goodLease(testIP)}.marshal())
	if _, err := leaseFrom(m, iaid(testMAC), epoch); err == nil {
		t.Error("a reply without a server id must not give a lease")
	}
}

package dhcp6

import (
	"net"
	"testing"
)

// FuzzParseDHCP6 feeds arbitrary bytes to what a server's answer goes through: the message
// parser, the reply filters and the lease reader. None may panic, and a lease that comes out
// must be one the network code can apply.
func FuzzParseDHCP6(f *testing.F) {
	f.Add(serverMsg(msgReply, 1, goodLease(testIP)...))
	f.Add(serverMsg(msgAdvertise, 1, append(goodLease(testIP), option{optNTPServer, []byte{0, 1, 0, 16, 0x20, 1, 0xd, 0xb8}})...))
	f.Add(serverMsg(msgReply, 1, ia(iaid(testMAC), 0, 0, statusOpt(statusNoBinding, "gone"))))
	f.Add(serverMsg(msgReply, 1, ia(iaid(testMAC), 0xffffffff, 1, iaAddr(testIP, 0xffffffff, 0xffffffff))))
	f.Add([]byte{7, 0, 0, 1, 0, 3, 0, 2, 0})
	c := &Client{MAC: testMAC, duid: duidLL(testMAC), iaid: iaid(testMAC)}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseMessage(data)
		if err != nil {
			return
		}
		_ = c.answer(msgReply, serverDUID, true)(m)
		_ = c.answer(msgAdvertise, nil, false)(m)
		_ = ntpServers(m)
		l, err := leaseFrom(m, c.iaid, epoch)
		if err != nil {
			return
		}
		if !usable(l.IP) || len(l.IP) != net.IPv6len || l.IPNet().String() == "<nil>" {
			t.Fatalf("address %v", l.IP)
		}
		if !(0 < l.T1 && l.T1 <= l.T2 && l.T2 < l.Valid && l.Valid >= minLease && l.Valid <= maxLifetime) {
			t.Fatalf("times: T1 %s, T2 %s, valid %s", l.T1, l.T2, l.Valid)
		}
		if len(l.ServerID) == 0 {
			t.Fatal("no server id")
		}
		for _, ip := range append(l.DNS, l.NTP...) {
			if len(ip) != net.IPv6len || ip.IsMulticast() || ip.IsUnspecified() {
				t.Fatalf("server %v", ip)
			}
		}
	})
}

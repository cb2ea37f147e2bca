package dhcp

import "testing"

// FuzzParseLease feeds arbitrary bytes to what a server's answer goes through: the packet
// parser, the lease reader and the reply filters. None may panic, and a lease that comes
// out must be one the network code can apply.
func FuzzParseLease(f *testing.F) {
	f.Add(serverReply(msgAck, 1, testMAC, testIP, gcpOptions()...))
	f.Add(serverReply(msgAck, 1, testMAC, testIP, opt(optClasslessRoutes, 33, 1, 2, 3, 4, 5, 6, 7, 8), opt(optMTU, 1)))
	f.Add(serverReply(msgOffer, 1, testMAC, testIP, opt(optMSClasslessRoutes, 24, 10, 0), opt(optLeaseTime, 0, 0, 0, 0)))
	f.Add(serverReply(msgNak, 1, testMAC, testIP, opt(optServerID, 1, 2, 3), []byte{optDNS, 200, 1}))
	f.Add(request{msgType: msgDiscover, xid: 1, mac: testMAC, ciaddr: testIP}.marshal())
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parsePacket(data)
		if err != nil {
			return
		}
		_ = isOffer(p)
		_ = answerFrom(testServer)(p)
		l, err := leaseOf(p, epoch, testServer)
		if err != nil {
			return
		}
		checkLease(t, l)
	})
}

func checkLease(t *testing.T, l Lease) {
	if !usableAddress(l.IP.To4()) {
		t.Fatalf("address %v", l.IP)
	}
	if ones, bits := l.Mask.Size(); bits != 32 || ones == 0 {
		t.Fatalf("mask %v", l.Mask)
	}
	if !(0 < l.Renew && l.Renew <= l.Rebind && l.Rebind < l.Lease && l.Lease >= minLease) {
		t.Fatalf("times: T1 %s, T2 %s, lease %s", l.Renew, l.Rebind, l.Lease)
	}
	if l.MTU != 0 && l.MTU < minMTU {
		t.Fatalf("MTU %d", l.MTU)
	}
	if l.Router != nil && len(l.Routes) > 0 {
		t.Fatal("option 3 must be ignored with classless routes")
	}
	for _, r := range l.Routes {
		ones, bits := r.Dst.Mask.Size()
		if bits != 32 || ones > 32 || !r.Dst.IP.Equal(r.Dst.IP.Mask(r.Dst.Mask)) || len(r.Dst.IP) != 4 {
			t.Fatalf("route %s", r)
		}
		if r.Gateway != nil && (r.Gateway.IsUnspecified() || len(r.Gateway) != 4) {
			t.Fatalf("route %s", r)
		}
	}
	if l.ServerID == nil || l.Expiry().Before(epoch) {
		t.Fatalf("%+v", l)
	}
}

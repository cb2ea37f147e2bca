package dhcp

import (
	"net"
	"strings"
	"testing"
	"time"
)

var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// leaseOfOptions parses an ACK carrying opts.
func leaseOfOptions(t *testing.T, opts ...[]byte) Lease {
	t.Helper()
	p, err := parsePacket(serverReply(msgAck, 1, testMAC, testIP, opts...))
	if err != nil {
		t.Fatal(err)
	}
	l, err := leaseFrom(p, epoch)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func routesString(rs []Route) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}

func TestLeaseGCP(t *testing.T) {
	l := leaseOfOptions(t, gcpOptions()...)
	if l.IPNet().String() != "10.128.0.5/32" || l.Router != nil || l.MTU != 1460 || l.Hostname != "vm-1" ||
		l.Domain != "c.project.internal" || len(l.DNS) != 1 || len(l.NTP) != 1 || !l.NTP[0].Equal(net.IPv4(169, 254, 169, 254)) ||
		!l.ServerID.Equal(testServer) || !l.Start.Equal(epoch) || !l.Expiry().Equal(epoch.Add(24*time.Hour)) {
		t.Fatalf("%+v", l)
	}
	if got := routesString(l.Routes); got != "10.128.0.1/32 on-link, 0.0.0.0/0 via 10.128.0.1" {
		t.Fatalf("routes %s", got)
	}
	if l.Renew != 12*time.Hour || l.Rebind != 21*time.Hour {
		t.Fatalf("T1 %s, T2 %s: want 0.5 and 0.875 of the lease", l.Renew, l.Rebind)
	}
}

func TestLeaseRouterWithoutClasslessRoutes(t *testing.T) {
	l := leaseOfOptions(t, opt(optRouter, 10, 128, 0, 1, 10, 128, 0, 2), opt(optSubnetMask, 255, 255, 240, 0))
	if !l.Router.Equal(testServer) || l.Routes != nil || l.IPNet().String() != "10.128.0.5/20" {
		t.Fatalf("%+v", l)
	}
	if l.Lease != defaultLease {
		t.Errorf("no option 51: lease %s", l.Lease)
	}
}

func TestLeaseClasslessRoutes(t *testing.T) {
	ms := opt(optMSClasslessRoutes, 8, 10, 192, 168, 0, 1)
	for _, c := range []struct {
		name string
		opts [][]byte
		want string
	}{
		{"249 alone", [][]byte{ms}, "10.0.0.0/8 via 192.168.0.1"},
		{"121 wins over 249", [][]byte{ms, opt(optClasslessRoutes, 0, 10, 0, 0, 1)}, "0.0.0.0/0 via 10.0.0.1"},
		{"bad 121 falls back to 249", [][]byte{ms, opt(optClasslessRoutes, 33, 1, 2, 3, 4, 5, 10, 0, 0, 1)}, "10.0.0.0/8 via 192.168.0.1"},
		{"bits past the prefix are cleared", [][]byte{opt(optClasslessRoutes, 20, 172, 16, 0xff, 0, 0, 0, 0)}, "172.16.240.0/20 on-link"},
		{"several", [][]byte{opt(optClasslessRoutes, 24, 192, 0, 2, 10, 0, 0, 1, 16, 172, 16, 10, 0, 0, 2, 32, 10, 0, 0, 1, 0, 0, 0, 0)},
			"192.0.2.0/24 via 10.0.0.1, 172.16.0.0/16 via 10.0.0.2, 10.0.0.1/32 on-link"},
		{"prefix over 32", [][]byte{opt(optClasslessRoutes, 33, 10, 0, 0, 0, 0, 10, 0, 0, 1)}, ""},
		{"truncated destination", [][]byte{opt(optClasslessRoutes, 24, 10, 0)}, ""},
		{"truncated gateway", [][]byte{opt(optClasslessRoutes, 0, 10, 0, 0)}, ""},
		{"good entry then a truncated one", [][]byte{opt(optClasslessRoutes, 0, 10, 0, 0, 1, 8)}, ""},
		{"zero length", [][]byte{opt(optClasslessRoutes)}, ""},
		{"broadcast gateway", [][]byte{opt(optClasslessRoutes, 0, 255, 255, 255, 255)}, ""},
	} {
		l := leaseOfOptions(t, append(c.opts, opt(optRouter, 10, 9, 9, 9))...)
		if got := routesString(l.Routes); got != c.want {
			t.Errorf("%s: routes %q, want %q", c.name, got, c.want)
		}
		if (c.want == "") != (l.Router != nil) {
			t.Errorf("%s: router %v: option 3 counts only without classless routes", c.name, l.Router)
		}
	}
}

func TestLeaseMalformedOptionsAreDropped(t *testing.T) {
	l := leaseOfOptions(t,
		opt(optSubnetMask, 255, 0, 255, 0),         // not contiguous
		opt(optRouter, 10, 0, 0),                   // short
		opt(optDNS, 1, 1, 1, 1, 8, 8),              // not a multiple of 4
		opt(optNTP),                                // empty
		opt(optMTU, 0x01, 0x00),                    // 256 < 576
		opt(optHostname, 'a', 0x1b, '[', '2', 'J'), // terminal escape
		opt(optDomain, []byte("example.com\x00")...),
		opt(optServerID, 1, 2),
		opt(optLeaseTime, 0, 0, 1),
		opt(optRenewalTime),
	)
	if l.Mask.String() != "ffffff00" || l.Router != nil || l.DNS != nil || l.NTP != nil || l.MTU != 0 || l.Hostname != "" ||
		l.Domain != "example.com" || l.ServerID != nil || l.Lease != defaultLease {
		t.Fatalf("%+v", l)
	}
	if l := leaseOfOptions(t, opt(optMTU, 0x02, 0x40)); l.MTU != 576 {
		t.Errorf("MTU 576 is the smallest allowed: %d", l.MTU)
	}
}

func TestLeaseTimes(t *testing.T) {
	for _, c := range []struct {
		name                string
		lease, t1, t2       []byte
		wantL, wantR, wantB time.Duration
	}{
		{"defaults", u32(1000), nil, nil, 1000 * time.Second, 500 * time.Second, 875 * time.Second},
		{"given", u32(120), u32(10), u32(15), 120 * time.Second, 10 * time.Second, 15 * time.Second},
		{"T1 after T2", u32(1000), u32(900), u32(800), 1000 * time.Second, 500 * time.Second, 800 * time.Second},
		{"T2 past the lease", u32(1000), u32(100), u32(2000), 1000 * time.Second, 100 * time.Second, 875 * time.Second},
		{"T2 before the default T1", u32(1000), nil, u32(200), 1000 * time.Second, 200 * time.Second, 200 * time.Second},
		{"zero lease", u32(0), u32(0), u32(0), minLease, minLease / 2, minLease / 8 * 7},
		{"infinite", u32(0xffffffff), nil, nil, 0xffffffff * time.Second, 0xffffffff * time.Second / 2, 0xffffffff * time.Second / 8 * 7},
	} {
		opts := [][]byte{opt(optLeaseTime, c.lease...)}
		if c.t1 != nil {
			opts = append(opts, opt(optRenewalTime, c.t1...))
		}
		if c.t2 != nil {
			opts = append(opts, opt(optRebindingTime, c.t2...))
		}
		l := leaseOfOptions(t, opts...)
		if l.Lease != c.wantL || l.Renew != c.wantR || l.Rebind != c.wantB {
			t.Errorf("%s: lease %s T1 %s T2 %s", c.name, l.Lease, l.Renew, l.Rebind)
		}
	}
}

func TestLeaseRejectsUnusableAddresses(t *testing.T) {
	for _, ip := range []net.IP{net.IPv4zero, net.IPv4bcast, net.IPv4(224, 0, 0, 1), net.IPv4(127, 0, 0, 1)} {
		p, _ := parsePacket(serverReply(msgAck, 1, testMAC, ip))
		if _, err := leaseFrom(p, epoch); err == nil {
			t.Errorf("%s was accepted", ip)
		}
	}
}

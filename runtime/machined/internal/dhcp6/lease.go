package dhcp6

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"time"
)

const (
	// minLease keeps a server's tiny valid lifetime from making the client renew in a loop.
	minLease = 20 * time.Second
	// minRenew is the earliest T1 taken.
	minRenew = 5 * time.Second
	// maxLifetime stands for infinity (0xffffffff) and caps anything longer.
	maxLifetime = 30 * 24 * time.Hour
)

// Lease is the address a REPLY gives, with the DNS and NTP servers it names.
type Lease struct {
	IP        net.IP // used as a /128: the prefix comes from router advertisements
	Preferred time.Duration
	Valid     time.Duration
	T1, T2    time.Duration // RENEW at T1, REBIND at T2
	ServerID  []byte        // the server's DUID
	DNS       []net.IP
	NTP       []net.IP
	// Start is when the message that got this lease was first sent: the times count from it.
	Start time.Time
}

// IPNet is the address as the interface takes it, a /128.
func (l Lease) IPNet() *net.IPNet { return &net.IPNet{IP: l.IP, Mask: net.CIDRMask(128, 128)} }

// Expiry is when the address's valid lifetime ends unless renewed.
func (l Lease) Expiry() time.Time { return l.Start.Add(l.Valid) }

// Server is the server's DUID in hex, for status.
func (l Lease) Server() string { return hex.EncodeToString(l.ServerID) }

// statusError is a server's refusal: a Status Code other than Success.
type statusError struct {
	code uint16
	text string
}

var statusNames = map[uint16]string{statusUnspecFail: "UnspecFail", statusNoAddrsAvail: "NoAddrsAvail",
	statusNoBinding: "NoBinding", statusNotOnLink: "NotOnLink", statusUseMulticast: "UseMulticast"}

func (e statusError) Error() string {
	name := statusNames[e.code]
	if name == "" {
		name = fmt.Sprintf("status %d", e.code)
	}
	if e.text != "" {
		return fmt.Sprintf("%s (%q)", name, e.text)
	}
	return name
}

// refusal says whether a status ends the binding: the server has no address for us, or
// none on this link, or no record of ours.
func (e statusError) refusal() bool {
	return e.code == statusNoAddrsAvail || e.code == statusNoBinding || e.code == statusNotOnLink
}

// leaseFrom reads the lease an ADVERTISE or REPLY gives the IA_NA id: its first usable
// address. A Status Code other than Success at the top or in the IA_NA is a statusError.
func leaseFrom(m message, id uint32, start time.Time) (Lease, error) {
	server := m.get(optServerID)
	if len(server) == 0 || len(server) > 130 {
		return Lease{}, fmt.Errorf("no server id")
	}
	if code, text := status(m.options); code != statusSuccess {
		return Lease{}, statusError{code, text}
	}
	for _, o := range m.options {
		if o.code != optIANA || len(o.value) < 12 || binary.BigEndian.Uint32(o.value) != id {
			continue
		}
		t1 := seconds(binary.BigEndian.Uint32(o.value[4:]))
		t2 := seconds(binary.BigEndian.Uint32(o.value[8:]))
		subs, err := parseOptions(o.value[12:])
		if err != nil {
			return Lease{}, fmt.Errorf("IA_NA: %v", err)
		}
		if code, text := status(subs); code != statusSuccess {
			return Lease{}, statusError{code, text}
		}
		if t1 > 0 && t2 > 0 && t1 > t2 {
			return Lease{}, fmt.Errorf("IA_NA: T1 %s after T2 %s", t1, t2) // RFC 8415 §21.4: discard it
		}
		for _, a := range subs {
			if a.code != optIAAddr || len(a.value) < 24 {
				continue
			}
			ip := net.IP(append([]byte(nil), a.value[:16]...))
			preferred := seconds(binary.BigEndian.Uint32(a.value[16:]))
			valid := seconds(binary.BigEndian.Uint32(a.value[20:]))
			asubs, err := parseOptions(a.value[24:])
			if err != nil || !usable(ip) || valid == 0 || preferred > valid {
				continue
			}
			if code, _ := status(asubs); code != statusSuccess {
				continue
			}
			l := Lease{IP: ip, Preferred: preferred, Valid: valid, ServerID: append([]byte(nil), server...), Start: start,
				DNS: addressList(m.get(optDNSServers)), NTP: ntpServers(m)}
			l.T1, l.T2 = times(t1, t2, preferred, valid)
			if l.Valid < minLease {
				l.Valid = minLease
			}
			return l, nil
		}
	}
	return Lease{}, statusError{code: statusNoAddrsAvail, text: "no usable address in the answer"}
}

// times picks T1 and T2: the server's, else half and four fifths of the preferred lifetime
// (RFC 8415 §21.4), kept in order and before the address expires.
func times(t1, t2, preferred, valid time.Duration) (time.Duration, time.Duration) {
	if valid < minLease {
		valid = minLease
	}
	base := preferred
	if base == 0 {
		base = valid
	}
	if t1 == 0 {
		t1 = base / 2
	}
	if t2 == 0 {
		t2 = base * 4 / 5
	}
	if t2 >= valid {
		t2 = valid * 7 / 8
	}
	if t1 > t2 {
		t1 = t2 / 2
	}
	if t1 < minRenew {
		t1 = minRenew
	}
	if t2 < t1 {
		t2 = t1
	}
	return t1, t2
}

// seconds reads a lifetime: 0xffffffff is infinity, capped like anything long.
func seconds(v uint32) time.Duration {
	d := time.Duration(v) * time.Second
	if v == 0xffffffff || d > maxLifetime {
		return maxLifetime
	}
	return d
}

// usable says whether ip can be the interface's global address.
func usable(ip net.IP) bool {
	return ip.To4() == nil && !ip.IsUnspecified() && !ip.IsLoopback() && !ip.IsMulticast() &&
		!ip.IsLinkLocalUnicast() && !bytes.Equal(ip[:12], net.IPv4zero.To16()[:12])
}

package ntp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPacketEncodeDecode(t *testing.T) {
	p := packet{
		leap: 1, version: 4, mode: modeServer, stratum: 2, poll: 6, precision: -23,
		rootDelay: 0x00012345, rootDispersion: 0x00006789, refID: [4]byte{192, 0, 2, 1},
		refTime: 0x0102030405060708, origin: 0x1112131415161718, receive: 0x2122232425262728, transmit: 0x3132333435363738,
	}
	b := p.marshal()
	if len(b) != packetLen || b[0] != 1<<6|4<<3|4 || b[3] != 0xe9 {
		t.Fatalf("encoded % x", b)
	}
	got, err := parsePacket(append(b, make([]byte, 20)...)) // a trailing MAC is ignored
	if err != nil || got != p {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

func TestRequest(t *testing.T) {
	b := request(0xdeadbeefcafef00d)
	want := make([]byte, packetLen)
	want[0] = 0x23 // LI 0, version 4, mode 3
	copy(want[40:], []byte{0xde, 0xad, 0xbe, 0xef, 0xca, 0xfe, 0xf0, 0x0d})
	if !bytes.Equal(b, want) {
		t.Fatalf("request % x", b)
	}
	if a, b := nonce(), nonce(); a == 0 || a == b {
		t.Fatalf("nonces %x %x", a, b)
	}
}

func TestParseShortAndGarbage(t *testing.T) {
	for _, b := range [][]byte{nil, {0x24}, make([]byte, 47), []byte("GET / HTTP/1.1\r\n\r\n")} {
		if _, err := parsePacket(b); err == nil {
			t.Errorf("%q parsed", b)
		}
	}
	// 48 bytes of garbage parse (it is a header, after all) but are no reply.
	p, err := parsePacket(bytes.Repeat([]byte{0xff}, 60))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkReply(p, 1); err == nil {
		t.Fatal("garbage accepted")
	}
}

func goodPacket(sent ntpTime) packet {
	now := toNTPTime(time.Now())
	return packet{version: 4, mode: modeServer, stratum: 2, origin: sent, receive: now, transmit: now, refID: [4]byte{'G', 'P', 'S'}}
}

func TestCheckReply(t *testing.T) {
	const sent = ntpTime(0x1234567890abcdef)
	if err := checkReply(goodPacket(sent), sent); err != nil {
		t.Fatal(err)
	}
	v3 := goodPacket(sent)
	v3.version = 3
	if err := checkReply(v3, sent); err != nil {
		t.Fatalf("version 3: %v", err)
	}
	cases := map[string]func(p *packet){
		"originate timestamp mismatch": func(p *packet) { p.origin++ },
		"mode 3":                       func(p *packet) { p.mode = modeClient },
		"mode 5":                       func(p *packet) { p.mode = 5 },
		"version 2":                    func(p *packet) { p.version = 2 },
		"version 5":                    func(p *packet) { p.version = 5 },
		"leap indicator 3":             func(p *packet) { p.leap = leapUnsync },
		"stratum 16":                   func(p *packet) { p.stratum = 16 },
		"zero timestamp":               func(p *packet) { p.transmit = 0 },
		"root distance":                func(p *packet) { p.rootDispersion = 2 << 16 },
	}
	for want, mutate := range cases {
		p := goodPacket(sent)
		mutate(&p)
		err := checkReply(p, sent)
		if err == nil || !strings.Contains(err.Error(), strings.Fields(want)[0]) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	p := goodPacket(sent)
	p.origin = 0
	if !errors.Is(checkReply(p, sent), errOriginMismatch) {
		t.Error("a zero originate timestamp was not a mismatch")
	}
}

func TestKissOfDeath(t *testing.T) {
	const sent = ntpTime(42)
	for code, want := range map[string]string{"RATE": "rate", "DENY": "denied", "RSTR": "denied", "INIT": "other"} {
		p := goodPacket(sent)
		p.stratum, p.leap = 0, leapUnsync
		copy(p.refID[:], code)
		var k *KissOfDeath
		if err := checkReply(p, sent); !errors.As(err, &k) || k.Code != code {
			t.Fatalf("%s: got %v", code, err)
		}
		got := "other"
		if k.Denied() {
			got = "denied"
		} else if k.RateLimited() {
			got = "rate"
		}
		if got != want {
			t.Errorf("%s: %s, want %s", code, got, want)
		}
	}
	// A kiss with the wrong originate timestamp is a spoof, not a kiss.
	p := goodPacket(sent)
	p.stratum, p.origin = 0, 7
	copy(p.refID[:], "DENY")
	if !errors.Is(checkReply(p, sent), errOriginMismatch) {
		t.Error("spoofed DENY accepted")
	}
	if c := kissCode([4]byte{'D', 0, 0xff, '\n'}); c != "D" {
		t.Errorf("kissCode kept %q", c)
	}
}

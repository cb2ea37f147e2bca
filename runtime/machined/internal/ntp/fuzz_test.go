package ntp

import (
	"bytes"
	"testing"
	"time"
)

// FuzzParsePacket feeds hostile datagrams through everything a reply goes through:
// parsing, validation (with the originate timestamp made to match, so the later checks
// are reached), era placement and the offset/delay calculation. None may panic, and an
// accepted sample must be within the bounds the checks promise, and, after the first sync,
// one server's sample can never step the clock.
func FuzzParsePacket(f *testing.F) {
	now := time.Now()
	good := reply(packet{transmit: 0x0123456789abcdef}, 0, 2)
	kod := good
	kod.stratum, kod.leap, kod.refID = 0, leapUnsync, [4]byte{'R', 'A', 'T', 'E'}
	for _, seed := range [][]byte{
		nil, {0}, make([]byte, 47), make([]byte, 48), bytes.Repeat([]byte{0xff}, 48),
		good.marshal(), kod.marshal(), append(good.marshal(), make([]byte, 68)...), request(1),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := parsePacket(data)
		if err != nil {
			if len(data) >= packetLen {
				t.Fatalf("a %d-byte packet failed to parse: %v", len(data), err)
			}
			return
		}
		if !bytes.Equal(p.marshal(), data[:packetLen]) {
			t.Fatal("encode(decode(b)) != b")
		}
		if err := checkReply(p, p.origin); err != nil {
			return
		}
		for _, t1 := range []time.Time{now, time.Unix(0, 0), time.Date(2036, 2, 7, 6, 28, 16, 0, time.UTC)} {
			s, err := newSample("fuzz", p, t1, t1.Add(time.Millisecond))
			if err != nil {
				continue
			}
			if s.Delay < 0 || s.Delay > maxDelay || s.Stratum < 1 || s.Stratum > maxStratum ||
				s.RootDelay/2+s.RootDispersion > maxRootDistance {
				t.Fatalf("accepted an out-of-bounds sample %+v", s)
			}
			// whatever one server says, after the first sync it alone never steps the clock
			// and moves it by MaxSlew at most
			if how, _ := decide(false, s, []Sample{s, s}); how == doStep || how == doSlew && abs(s.Offset) > MaxSlew {
				t.Fatalf("one server's sample %+v: correction %v", s, how)
			}
		}
	})
}

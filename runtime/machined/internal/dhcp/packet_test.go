package dhcp

import (
	"bytes"
	"testing"
)

func TestMarshalRequest(t *testing.T) {
	b := request{msgType: msgRequest, xid: 42, mac: testMAC, options: []option{{optRequestedIP, testIP}}}.marshal()
	if len(b) < minPacketLen || b[10] != 0x80 {
		t.Fatalf("length %d, flags %x: want >= %d bytes and the broadcast flag", len(b), b[10], minPacketLen)
	}
	p, err := parsePacket(b)
	if err != nil || p.op != opRequest || p.xid != 42 || p.chaddr.String() != testMAC.String() || p.msgType() != msgRequest ||
		!bytes.Equal(p.options[optRequestedIP], testIP) || !p.ciaddr.IsUnspecified() {
		t.Fatalf("%+v %v", p, err)
	}
	if !bytes.Equal(p.options[optParamList], paramList) {
		t.Errorf("parameter request list %v", p.options[optParamList])
	}
	for _, code := range []byte{1, 3, 6, 12, 15, 26, 42, 51, 58, 59, 121, 249} {
		if bytes.IndexByte(paramList, code) < 0 {
			t.Errorf("option %d is not requested", code)
		}
	}
}

func TestMarshalRenewal(t *testing.T) {
	b := request{msgType: msgRequest, xid: 7, mac: testMAC, ciaddr: testIP}.marshal()
	p, _ := parsePacket(b)
	if p.flags != 0 || !p.ciaddr.Equal(testIP) {
		t.Fatalf("a renewal carries ciaddr and no broadcast flag: %+v", p)
	}
	if _, ok := p.options[optRequestedIP]; ok {
		t.Error("a renewal must not carry a requested address")
	}
	if _, ok := p.options[optServerID]; ok {
		t.Error("a renewal must not carry a server id")
	}
}

func TestAppendOptionSplitsLongValues(t *testing.T) {
	long := bytes.Repeat([]byte{7}, 600)
	b := appendOption(nil, optClasslessRoutes, long)
	if len(b) != 600+3*2 || b[1] != 255 || b[2+255+1] != 255 || b[2*257+1] != 90 {
		t.Fatalf("split into %d bytes", len(b))
	}
	opts := map[byte][]byte{}
	parseOptions(b, opts)
	if !bytes.Equal(opts[optClasslessRoutes], long) {
		t.Fatal("RFC 3396: the pieces must be joined again")
	}
}

func TestParsePacketHostile(t *testing.T) {
	good := serverReply(msgAck, 1, testMAC, testIP, opt(optServerID, testServer...))
	if _, err := parsePacket(good[:200]); err == nil {
		t.Error("a short packet must fail")
	}
	bad := append([]byte(nil), good...)
	bad[236] = 0
	if _, err := parsePacket(bad); err == nil {
		t.Error("no magic cookie must fail")
	}
	trunc := append(append([]byte(nil), good[:len(good)-1]...), optDNS, 8, 1, 2)
	p, err := parsePacket(trunc)
	if err != nil || !p.serverID().Equal(testServer) || p.options[optDNS] != nil {
		t.Errorf("a truncated last option is dropped, the rest kept: %+v %v", p.options, err)
	}
	long := append([]byte(nil), good...)
	long[2] = 200 // hardware address length past chaddr
	if p, err := parsePacket(long); err != nil || len(p.chaddr) != 16 {
		t.Errorf("hlen 200: %v %v", p.chaddr, err)
	}
	for _, tail := range [][]byte{{optDNS}, {optDNS, 0}, {optPad, optPad}} {
		b := append(append([]byte(nil), good[:len(good)-1]...), tail...)
		if _, err := parsePacket(b); err != nil {
			t.Errorf("tail %v: %v", tail, err)
		}
	}
	if (packet{options: map[byte][]byte{optServerID: {1, 2, 3}}}).serverID() != nil {
		t.Error("a 3-byte server id")
	}
}

package dhcp

import (
	"encoding/binary"
	"net"
)

var (
	testMAC    = net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	testServer = net.IPv4(10, 128, 0, 1).To4()
	testIP     = net.IPv4(10, 128, 0, 5).To4()
)

// opt encodes one option as a server would.
func opt(code byte, value ...byte) []byte {
	return append([]byte{code, byte(len(value))}, value...)
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// serverReply builds a BOOTREPLY of msgType to xid and mac, offering yiaddr, with raw options.
func serverReply(msgType byte, xid uint32, mac net.HardwareAddr, yiaddr net.IP, opts ...[]byte) []byte {
	b := make([]byte, headerLen)
	b[0], b[1], b[2] = opReply, 1, byte(len(mac))
	binary.BigEndian.PutUint32(b[4:], xid)
	copy(b[16:20], yiaddr.To4())
	copy(b[28:], mac)
	copy(b[236:], magicCookie)
	b = append(b, opt(optMessageType, msgType)...)
	for _, o := range opts {
		b = append(b, o...)
	}
	return append(b, optEnd)
}

// gcpOptions is what Google Compute Engine's server sends: a /32, a router the RFC 3442
// routes override, and an on-link host route to the gateway before the default route.
func gcpOptions() [][]byte {
	return [][]byte{
		opt(optServerID, testServer...),
		opt(optSubnetMask, 255, 255, 255, 255),
		opt(optRouter, testServer...),
		opt(optClasslessRoutes, 32, 10, 128, 0, 1, 0, 0, 0, 0, 0, 10, 128, 0, 1),
		opt(optDNS, 169, 254, 169, 254),
		opt(optNTP, 169, 254, 169, 254),
		opt(optMTU, 0x05, 0xb4),
		opt(optHostname, []byte("vm-1")...),
		opt(optDomain, []byte("c.project.internal")...),
		opt(optLeaseTime, u32(86400)...),
	}
}

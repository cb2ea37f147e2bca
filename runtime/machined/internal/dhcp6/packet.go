package dhcp6

import (
	"encoding/binary"
	"errors"
	"net"
)

// Message types (RFC 8415 §7.3).
const (
	msgSolicit   = 1
	msgAdvertise = 2
	msgRequest   = 3
	msgRenew     = 5
	msgRebind    = 6
	msgReply     = 7
)

// Options (RFC 8415 §21, RFC 3646, RFC 4075, RFC 5908).
const (
	optClientID    = 1
	optServerID    = 2
	optIANA        = 3
	optIAAddr      = 5
	optORO         = 6
	optElapsedTime = 8
	optStatusCode  = 13
	optDNSServers  = 23
	optSNTPServers = 31
	optNTPServer   = 56

	ntpSubAddr = 1 // NTP_SUBOPTION_SRV_ADDR
)

// Status codes (RFC 8415 §21.13).
const (
	statusSuccess      = 0
	statusUnspecFail   = 1
	statusNoAddrsAvail = 2
	statusNoBinding    = 3
	statusNotOnLink    = 4
	statusUseMulticast = 5
)

// option is one option's code and raw value.
type option struct {
	code  uint16
	value []byte
}

// message is a client/server message: type, 24-bit transaction id, options in order.
type message struct {
	msgType byte
	xid     uint32
	options []option
}

var errShort = errors.New("DHCPv6 message too short")

// parseMessage reads a client/server message. It checks only the framing: options are read
// by whoever wants them and are checked there.
func parseMessage(b []byte) (message, error) {
	if len(b) < 4 {
		return message{}, errShort
	}
	m := message{msgType: b[0], xid: uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])}
	opts, err := parseOptions(b[4:])
	m.options = opts
	return m, err
}

// parseOptions reads a run of options (code, length, value); a truncated last option is an error.
func parseOptions(b []byte) ([]option, error) {
	var out []option
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errShort
		}
		code, n := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
		if len(b) < 4+n {
			return nil, errShort
		}
		out = append(out, option{code, b[4 : 4+n]})
		b = b[4+n:]
	}
	return out, nil
}

// get is the first option with code, nil when there is none.
func get(opts []option, code uint16) []byte {
	for _, o := range opts {
		if o.code == code {
			return o.value
		}
	}
	return nil
}

func (m message) get(code uint16) []byte { return get(m.options, code) }

// marshal encodes the message.
func (m message) marshal() []byte {
	b := []byte{m.msgType, byte(m.xid >> 16), byte(m.xid >> 8), byte(m.xid)}
	return appendOptions(b, m.options)
}

func appendOptions(b []byte, opts []option) []byte {
	for _, o := range opts {
		b = binary.BigEndian.AppendUint16(b, o.code)
		b = binary.BigEndian.AppendUint16(b, uint16(len(o.value)))
		b = append(b, o.value...)
	}
	return b
}

// duidLL is a DUID-LL (type 3) for Ethernet (hardware type 1): stable for the MAC, and
// needing no clock or storage, which an immutable machine does not keep across boots.
func duidLL(mac net.HardwareAddr) []byte {
	return append([]byte{0, 3, 0, 1}, mac...)
}

// iaid names the client's one IA_NA: the MAC's last four bytes, stable across boots.
func iaid(mac net.HardwareAddr) uint32 {
	var b [4]byte
	if len(mac) >= 4 {
		copy(b[:], mac[len(mac)-4:])
	}
	return binary.BigEndian.Uint32(b[:])
}

// iaNA encodes an IA_NA, with the address asked for when addr is set (lifetimes and
// T1/T2 0: the server chooses).
func iaNA(id uint32, addr net.IP) option {
	v := binary.BigEndian.AppendUint32(nil, id)
	v = append(v, make([]byte, 8)...)
	if addr != nil {
		ia := append(append([]byte(nil), addr.To16()...), make([]byte, 8)...)
		v = appendOptions(v, []option{{optIAAddr, ia}})
	}
	return option{optIANA, v}
}

// oro asks for DNS and NTP servers.
func oro() option {
	var v []byte
	for _, c := range []uint16{optDNSServers, optNTPServer, optSNTPServers} {
		v = binary.BigEndian.AppendUint16(v, c)
	}
	return option{optORO, v}
}

// elapsed is the Elapsed Time option: hundredths of a second since the exchange began.
func elapsed(d int64) option {
	cs := d / 1e7
	if cs > 0xffff || cs < 0 {
		cs = 0xffff
	}
	return option{optElapsedTime, binary.BigEndian.AppendUint16(nil, uint16(cs))}
}

// status reads a Status Code option: its code, success when there is none.
func status(opts []option) (code uint16, text string) {
	v := get(opts, optStatusCode)
	if len(v) < 2 {
		return statusSuccess, ""
	}
	return binary.BigEndian.Uint16(v), string(v[2:])
}

// addressList reads a list of IPv6 addresses (options 23 and 31), dropping unusable ones.
func addressList(v []byte) []net.IP {
	var out []net.IP
	for ; len(v) >= 16; v = v[16:] {
		ip := net.IP(append([]byte(nil), v[:16]...))
		if !ip.IsUnspecified() && !ip.IsMulticast() && ip.To4() == nil {
			out = append(out, ip)
		}
	}
	return out
}

// ntpServers reads option 56's server addresses (the multicast and FQDN suboptions are
// not used); SNTP's option 31 when 56 has none.
func ntpServers(m message) []net.IP {
	var out []net.IP
	for _, o := range m.options {
		if o.code != optNTPServer {
			continue
		}
		subs, err := parseOptions(o.value)
		if err != nil {
			continue
		}
		for _, s := range subs {
			if s.code == ntpSubAddr && len(s.value) == 16 {
				out = append(out, addressList(s.value)...)
			}
		}
	}
	if len(out) == 0 {
		out = addressList(m.get(optSNTPServers))
	}
	return out
}

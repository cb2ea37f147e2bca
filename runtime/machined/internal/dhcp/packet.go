package dhcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
)

// BOOTP message types, DHCP message types (option 53) and the option codes the client uses.
const (
	opRequest = 1
	opReply   = 2

	msgDiscover = 1
	msgOffer    = 2
	msgRequest  = 3
	msgAck      = 5
	msgNak      = 6

	optPad               = 0
	optSubnetMask        = 1
	optRouter            = 3
	optDNS               = 6
	optHostname          = 12
	optDomain            = 15
	optMTU               = 26
	optNTP               = 42
	optRequestedIP       = 50
	optLeaseTime         = 51
	optMessageType       = 53
	optServerID          = 54
	optParamList         = 55
	optMaxMessageSize    = 57
	optRenewalTime       = 58
	optRebindingTime     = 59
	optClasslessRoutes   = 121
	optMSClasslessRoutes = 249
	optEnd               = 255

	headerLen    = 240  // the fixed BOOTP fields and the magic cookie
	minPacketLen = 300  // some servers drop BOOTP messages shorter than this
	maxReplySize = 1500 // what option 57 offers; our receive buffer is larger
	flagBcast    = 0x8000
)

var magicCookie = []byte{99, 130, 83, 99}

// paramList is option 55: everything leaseFrom reads. RFC 3442 asks for 121 before 3.
var paramList = []byte{optSubnetMask, optClasslessRoutes, optRouter, optDNS, optHostname, optDomain,
	optMTU, optNTP, optLeaseTime, optRenewalTime, optRebindingTime, optMSClasslessRoutes}

// option is one option of a message we send.
type option struct {
	code  byte
	value []byte
}

// request is a client message before it is encoded.
type request struct {
	msgType byte
	xid     uint32
	mac     net.HardwareAddr
	ciaddr  net.IP // our address when renewing or rebinding; nil before we have one
	options []option
}

// marshal encodes the message. Without ciaddr it sets the broadcast flag: a client with no
// address cannot receive a unicast reply.
func (r request) marshal() []byte {
	b := make([]byte, headerLen, minPacketLen)
	b[0] = opRequest
	b[1] = 1 // Ethernet
	b[2] = byte(copy(b[28:44], r.mac))
	binary.BigEndian.PutUint32(b[4:], r.xid)
	if ip := r.ciaddr.To4(); ip != nil {
		copy(b[12:16], ip)
	} else {
		binary.BigEndian.PutUint16(b[10:], flagBcast)
	}
	copy(b[236:], magicCookie)
	b = appendOption(b, optMessageType, []byte{r.msgType})
	for _, o := range r.options {
		b = appendOption(b, o.code, o.value)
	}
	b = appendOption(b, optMaxMessageSize, []byte{maxReplySize >> 8, maxReplySize & 0xff})
	b = appendOption(b, optParamList, paramList)
	b = append(b, optEnd)
	for len(b) < minPacketLen {
		b = append(b, optPad)
	}
	return b
}

// appendOption writes one option, split into 255-byte pieces as RFC 3396 allows.
func appendOption(b []byte, code byte, value []byte) []byte {
	for {
		n := len(value)
		if n > 255 {
			n = 255
		}
		b = append(b, code, byte(n))
		b = append(b, value[:n]...)
		value = value[n:]
		if len(value) == 0 {
			return b
		}
	}
}

// packet is a decoded BOOTP message.
type packet struct {
	op      byte
	xid     uint32
	flags   uint16
	ciaddr  net.IP
	yiaddr  net.IP
	chaddr  net.HardwareAddr
	options map[byte][]byte // repeated options concatenated (RFC 3396)
}

func (p packet) msgType() byte {
	if v := p.options[optMessageType]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// serverID is option 54, nil when it is missing or malformed.
func (p packet) serverID() net.IP {
	ip, _ := oneIPv4(p.options[optServerID])
	return ip
}

var errNotDHCP = errors.New("not a DHCP message")

// parsePacket decodes a BOOTP message. The fixed fields must be whole; an option running
// past the end of the message ends the option list, keeping the options before it.
func parsePacket(b []byte) (packet, error) {
	if len(b) < headerLen || !bytes.Equal(b[236:240], magicCookie) {
		return packet{}, errNotDHCP
	}
	hlen := int(b[2])
	if hlen > 16 {
		hlen = 16
	}
	p := packet{
		op:      b[0],
		xid:     binary.BigEndian.Uint32(b[4:]),
		flags:   binary.BigEndian.Uint16(b[10:]),
		ciaddr:  net.IP(append([]byte(nil), b[12:16]...)),
		yiaddr:  net.IP(append([]byte(nil), b[16:20]...)),
		chaddr:  net.HardwareAddr(append([]byte(nil), b[28:28+hlen]...)),
		options: map[byte][]byte{},
	}
	parseOptions(b[headerLen:], p.options)
	return p, nil
}

// parseOptions reads code-length-value options into opts until the end option or a truncation.
func parseOptions(b []byte, opts map[byte][]byte) {
	for len(b) > 0 {
		code := b[0]
		if code == optEnd {
			return
		}
		if code == optPad {
			b = b[1:]
			continue
		}
		if len(b) < 2 || len(b) < 2+int(b[1]) {
			return
		}
		n := int(b[1])
		opts[code] = append(opts[code], b[2:2+n]...)
		b = b[2+n:]
	}
}

package ntp

import (
	"encoding/binary"
	"fmt"
)

// packetLen is the NTP header. Replies may be longer (extension fields, a MAC); SNTP
// clients ignore what follows the header.
const packetLen = 48

const (
	modeClient = 3
	modeServer = 4
	leapUnsync = 3 // leap indicator "alarm": the server's clock is not synchronised
	maxStratum = 15
)

// packet is the NTP header (RFC 5905 section 7.3).
type packet struct {
	leap, version, mode uint8
	stratum             uint8
	poll, precision     int8
	rootDelay           uint32 // 16.16 seconds
	rootDispersion      uint32 // 16.16 seconds
	refID               [4]byte
	refTime             ntpTime
	origin              ntpTime // the client's transmit timestamp, echoed
	receive             ntpTime // when the server received the request
	transmit            ntpTime // when the server sent the reply
}

func (p *packet) marshal() []byte {
	b := make([]byte, packetLen)
	b[0] = p.leap<<6 | (p.version&7)<<3 | p.mode&7
	b[1] = p.stratum
	b[2] = byte(p.poll)
	b[3] = byte(p.precision)
	binary.BigEndian.PutUint32(b[4:], p.rootDelay)
	binary.BigEndian.PutUint32(b[8:], p.rootDispersion)
	copy(b[12:16], p.refID[:])
	binary.BigEndian.PutUint64(b[16:], uint64(p.refTime))
	binary.BigEndian.PutUint64(b[24:], uint64(p.origin))
	binary.BigEndian.PutUint64(b[32:], uint64(p.receive))
	binary.BigEndian.PutUint64(b[40:], uint64(p.transmit))
	return b
}

// parsePacket decodes the header of b. Only the length is checked here; whether the
// packet is an acceptable reply is checkReply's business.
func parsePacket(b []byte) (packet, error) {
	if len(b) < packetLen {
		return packet{}, fmt.Errorf("short NTP packet (%d bytes)", len(b))
	}
	p := packet{
		leap:           b[0] >> 6,
		version:        b[0] >> 3 & 7,
		mode:           b[0] & 7,
		stratum:        b[1],
		poll:           int8(b[2]),
		precision:      int8(b[3]),
		rootDelay:      binary.BigEndian.Uint32(b[4:]),
		rootDispersion: binary.BigEndian.Uint32(b[8:]),
		refTime:        ntpTime(binary.BigEndian.Uint64(b[16:])),
		origin:         ntpTime(binary.BigEndian.Uint64(b[24:])),
		receive:        ntpTime(binary.BigEndian.Uint64(b[32:])),
		transmit:       ntpTime(binary.BigEndian.Uint64(b[40:])),
	}
	copy(p.refID[:], b[12:16])
	return p, nil
}

// request is a client-mode query. Its transmit timestamp is a random nonce rather than
// the local time: the server echoes it as the reply's originate timestamp, which lets us
// match replies to requests (an off-path spoofer cannot guess it) without telling anyone
// what our clock says. The local send time is kept on our side.
func request(nonce ntpTime) []byte {
	p := packet{version: 4, mode: modeClient, transmit: nonce}
	return p.marshal()
}

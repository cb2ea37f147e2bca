// Package ntp keeps machined's clock sane with SNTP (RFC 4330, the client side of RFC 5905).
//
// A VM's RTC may be far off, and TLS to metadata services, registries and machined's own API
// fails on a clock outside a certificate's validity. Syncer polls the configured servers,
// keeps the lowest-delay sample of each, takes the median offset across servers, and steps
// the clock when it is more than 128 ms off or slews it otherwise. Only the first sync since
// boot may step on one server's word: after it, a step needs two servers that agree, an
// offset up to MaxSlew (1 s) is slewed, and a larger one from a lone server is refused with a
// console line (servers can come from DHCP, which anyone on the link can answer). This is deliberately not
// a full NTP discipline (no frequency correction, no peer selection beyond the median):
// a clock within milliseconds is all machined needs.
package ntp

package ntp

import (
	"syscall"
	"time"
)

// adjOffsetSingleshot is ADJ_OFFSET_SINGLESHOT: adjtimex(2) then behaves as adjtime(3).
const adjOffsetSingleshot = 0x8001

// SystemSetter sets the real system clock; it needs CAP_SYS_TIME, which machined as PID 1 has.
//
// Slewing uses adjtime semantics (adjtimex with ADJ_OFFSET_SINGLESHOT): the kernel speeds
// up or slows down the clock by 0.05% until the offset is absorbed, so the 128 ms
// threshold is slewed away in about 4 minutes, well within a poll interval. A new slew
// replaces what is left of the previous one, which is right because each measurement
// already includes the part slewed so far. It is a single system call, simpler and less
// stateful than driving the kernel PLL (which would also correct frequency, a precision
// machined does not need). Stepping also cancels any slew in progress (the kernel clears
// its NTP state on a step).
type SystemSetter struct{}

// Step sets the clock to now + offset with settimeofday(2); microseconds are ample for
// offsets measured over a network.
func (SystemSetter) Step(offset time.Duration) error {
	tv := syscall.NsecToTimeval(time.Now().Add(offset).UnixNano())
	return syscall.Settimeofday(&tv)
}

// Slew starts a gradual correction of offset.
func (SystemSetter) Slew(offset time.Duration) error {
	tx := syscall.Timex{Modes: adjOffsetSingleshot}
	setLong(&tx.Offset, offset.Microseconds())
	_, err := syscall.Adjtimex(&tx)
	return err
}

// setLong stores v in a C long field, whose Go type depends on the architecture.
func setLong[T int32 | int64](field *T, v int64) { *field = T(v) }

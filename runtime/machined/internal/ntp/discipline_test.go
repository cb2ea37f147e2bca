package ntp

import (
	"errors"
	"testing"
	"time"
)

func TestStepOrSlew(t *testing.T) {
	cases := []struct {
		offset  time.Duration
		stepped bool
	}{
		{ms(200), true}, {ms(-200), true}, {time.Hour, true},
		{ms(128), false}, {ms(-128), false}, {ms(50), false}, {0, false},
	}
	for _, c := range cases {
		f := newFakeClock(0)
		stepped, err := correct(f, c.offset)
		steps, slews := f.calls()
		if err != nil || stepped != c.stepped {
			t.Errorf("%v: stepped %v, %v", c.offset, stepped, err)
		}
		if c.stepped && (len(steps) != 1 || steps[0] != c.offset || len(slews) != 0) ||
			!c.stepped && (len(slews) != 1 || slews[0] != c.offset || len(steps) != 0) {
			t.Errorf("%v: steps %v slews %v", c.offset, steps, slews)
		}
	}
	f := newFakeClock(0)
	f.setErr = errors.New("EPERM")
	if _, err := correct(f, time.Hour); err == nil {
		t.Fatal("setter error lost")
	}
}

func TestSetLong(t *testing.T) {
	var a int32
	var b int64
	setLong(&a, -128000)
	setLong(&b, 128000)
	if a != -128000 || b != 128000 {
		t.Fatal(a, b)
	}
}

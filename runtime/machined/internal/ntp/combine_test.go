package ntp

import (
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestBest(t *testing.T) {
	if _, ok := best(nil); ok {
		t.Fatal("best of nothing")
	}
	b, _ := best([]Sample{{Offset: ms(1), Delay: ms(30)}, {Offset: ms(2), Delay: ms(10)}, {Offset: ms(3), Delay: ms(20)}})
	if b.Offset != ms(2) {
		t.Fatalf("%+v", b)
	}
}

func TestCombineMedian(t *testing.T) {
	if _, ok := combine(nil); ok {
		t.Fatal("combined nothing")
	}
	// One falseticker among three cannot move the result.
	c, _ := combine([]Sample{{Server: "a", Offset: ms(10)}, {Server: "bad", Offset: time.Hour}, {Server: "b", Offset: ms(12)}})
	if c.Server != "b" || c.Offset != ms(12) {
		t.Fatalf("%+v", c)
	}
	// Even count: mean of the middle two, reported as the lower-delay one.
	c, _ = combine([]Sample{{Server: "a", Offset: ms(10), Delay: ms(5)}, {Server: "b", Offset: ms(20), Delay: ms(3)}, {Server: "c", Offset: ms(-50)}, {Server: "d", Offset: ms(90)}})
	if c.Server != "b" || c.Offset != ms(15) {
		t.Fatalf("%+v", c)
	}
	c, _ = combine([]Sample{{Server: "only", Offset: ms(-7)}})
	if c.Server != "only" || c.Offset != ms(-7) {
		t.Fatalf("%+v", c)
	}
}

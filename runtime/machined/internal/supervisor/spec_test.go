package supervisor

import (
	"strings"
	"testing"
	"time"
)

func TestServiceDefaultsAndDependencies(t *testing.T) {
	s := ServiceSpec{Name: "a", Command: "/bin/true"}
	if err := s.Validate(); err != nil || s.Restart != RestartOnFailure {
		t.Fatalf("default restart: %q %v", s.Restart, err)
	}
	specs := []ServiceSpec{{Name: "a", After: []string{"b"}}, {Name: "b", After: []string{"c"}}, {Name: "c", After: []string{"a"}}}
	if err := checkDependencies(specs); err == nil || !strings.Contains(err.Error(), "cycle: a -> b -> c -> a") {
		t.Fatalf("cycle: %v", err)
	}
	if err := checkDependencies([]ServiceSpec{{Name: "a", After: []string{"ghost"}}}); err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("unknown dependency: %v", err)
	}
	merged := MergeServices(
		[]ServiceSpec{{Name: "web", Command: "/ext/web", Source: "ext.json"}, {Name: "agent", Command: "/ext/agent"}},
		[]ServiceSpec{{Name: "web", Command: "/cfg/web"}})
	if len(merged) != 2 || merged[1].Command != "/cfg/web" || merged[1].Source != "machine config" {
		t.Fatalf("merge: %+v", merged)
	}
}

func TestBackoffDoublesUpToItsMax(t *testing.T) {
	if backoff(time.Second, 30*time.Second, 1) != time.Second || backoff(time.Second, 30*time.Second, 6) != 30*time.Second {
		t.Fatal("backoff")
	}
}

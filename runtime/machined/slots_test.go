package main

import (
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/bootstate"
)

func TestSlotsOffAnABDiskDoNothing(t *testing.T) {
	for _, s := range []*slots{nil, findSlots("", "/dev/vda", nil), findSlots("A", "", nil), findSlots("C", "/dev/vda", nil)} {
		if s.describe() != "" || s.status() != nil || s.markGood("2") != nil {
			t.Fatalf("%+v acted", s)
		}
		if _, err := s.rollback(); err == nil {
			t.Fatalf("%+v rolled back", s)
		}
	}
}

func TestSlotsWithoutABootPartitionSayWhy(t *testing.T) {
	s := findSlots("A", "/dev/vda", nil)
	if !strings.Contains(s.describe(), "no BOOT partition on /dev/vda") {
		t.Fatalf("describe: %q", s.describe())
	}
	if _, err := s.rollback(); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Fatalf("rollback: %v", err)
	}
}

func TestSlotsStatusAfterARolledBackUpgrade(t *testing.T) {
	st := bootstate.State{Default: "A", Rollback: "B", Versions: map[string]string{"A": "1", "B": "2"}}
	s := &slots{slot: "A", state: st, booted: st.Booted("A")}
	got := s.status()
	if got["slot"] != "A" || got["rolled_back"] != true || got["rolled_back_version"] != "2" || got["previous_version"] != "2" {
		t.Fatalf("status: %v", got)
	}
	if !strings.Contains(s.describe(), "slot B did not reach ready and was rolled back") {
		t.Fatalf("describe: %q", s.describe())
	}
	// slot B holds what failed: a rollback to it is refused before BOOT is touched
	if _, err := s.rollback(); err == nil || !strings.Contains(err.Error(), "slot B did not reach ready") {
		t.Fatalf("rollback to the rolled-back slot: %v", err)
	}
}

func TestSlotsStatusOnTrial(t *testing.T) {
	st := bootstate.State{Default: "A", Next: "B", Tries: 2}
	s := &slots{slot: "B", state: st, booted: st.Booted("B")}
	if s.booted != "trial" || !strings.Contains(s.describe(), "on trial (2 tries left") {
		t.Fatalf("%+v: %q", s, s.describe())
	}
	trial, ok := s.status()["trial"].(map[string]interface{})
	if !ok || trial["slot"] != "B" || trial["tries_left"] != 2 {
		t.Fatalf("status: %v", s.status())
	}
}

func TestTrialTimeout(t *testing.T) {
	if got := trialTimeout(map[string]string{}); got != defaultTrialTimeout {
		t.Fatalf("default: %v", got)
	}
	if got := trialTimeout(map[string]string{paramTrial: "90"}); got != 90*time.Second {
		t.Fatalf("90: %v", got)
	}
	for _, bad := range []string{"-5", "0", "soon", ""} {
		if got := trialTimeout(map[string]string{paramTrial: bad}); got != defaultTrialTimeout {
			t.Fatalf("%q: %v", bad, got)
		}
	}
}

package main

import (
	"testing"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// Before the ready line the API controller leaves the API to the boot (no api/status); an API
// that is off says so, at the config version it read.
func TestTheAPIControllerWaitsForReadyAndSaysWhenTheAPIIsOff(t *testing.T) {
	state := resource.NewState()
	for typ, owner := range map[resource.Type]string{machineConfigType: configOwner, readyType: readyOwner} {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	ctrl := runCounted(t, state, &apiController{running: func() runningAPI { return runningAPI{} }, say: t.Logf})
	wait.Until(t, "the controller's first run", 5*time.Second, func() bool { return ctrl.count() >= 1 })
	runs := ctrl.count()
	if _, err := state.Put(configOwner, machineConfigType, machineConfigID, configSpec("test", &Config{})); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the controller's run for the config", 5*time.Second, func() bool { return ctrl.count() > runs })
	if _, ok := state.Get(apiStatusType, apiStatusID); ok {
		t.Fatal("api/status before the ready line")
	}
	if _, err := state.Put(readyOwner, readyType, readyID, readySpec{}); err != nil {
		t.Fatal(err)
	}
	m := &machine{resources: state}
	wait.Until(t, "api/status", 5*time.Second, func() bool { return len(m.Resources("api")) == 1 })
	if got := m.Resources("api")[0].Spec; got != (apiStatusSpec{ConfigVersion: 1}) {
		t.Fatalf("api/status of an API that is off: %+v", got)
	}
}

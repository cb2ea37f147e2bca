package main

import (
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"kiln/machined/internal/resource"
)

// TestConfigApplyLatency measures a config change over the API to the machine showing it: a
// POST /v1/config (real mutual TLS on loopback, a new connection each, as kiln node apply-config
// makes) that changes the hostname and eth0's static address, timed until its answer, until
// config/machine holds the new version and until network/status says the network controller
// applied it (the network applier is a recorder: the kernel's side is the e2e tests'). The same
// POST with mode=dry_run (parsed and planned, nothing kept or applied) is the baseline. Writes
// the figures to $KILN_CONFIG_BENCH (bench/config_apply.py runs it); without it, skipped.
func TestConfigApplyLatency(t *testing.T) {
	out := benchOutput(t, "KILN_CONFIG_BENCH", "bench/config_apply.py")
	const applies = 200
	c := newConfigMachine(t)
	admin := c.api.client(t, "admin")
	var dryRun, answered, published, applied []time.Duration
	for i := 0; i < applies; i++ {
		doc := fmt.Sprintf("hostname: node-%d\ninstall: {disk: /dev/vda}\nnetwork:\n  interfaces:\n"+
			"    - {name: eth0, addresses: [10.0.%d.%d/24], dhcp: false}\nservices:\n  - {name: web, command: /bin/web}\n",
			i, 3+i/250, 1+i%250)
		admin.CloseIdleConnections()
		began := time.Now()
		if code, _, msg := c.postWith(t, admin, "?mode=dry_run", doc); code != http.StatusOK {
			t.Fatalf("dry run %d: %d %s", i, code, msg)
		}
		dryRun = append(dryRun, time.Since(began))

		admin.CloseIdleConnections()
		began = time.Now()
		code, report, msg := c.postWith(t, admin, "", doc)
		if code != http.StatusOK {
			t.Fatalf("apply %d: %d %s", i, code, msg)
		}
		answered = append(answered, time.Since(began))
		c.waitConfigVersion(t, report.ConfigVersion)
		published = append(published, time.Since(began))
		c.waitNetworkApplied(t, report.ConfigVersion)
		applied = append(applied, time.Since(began))
	}
	results := map[string]interface{}{"applies": applies}
	for name, samples := range map[string][]time.Duration{
		"dry_run_answered": dryRun, "answered": answered, "config_published": published, "network_applied": applied,
	} {
		results[name+"_ms"] = percentiles(samples)
	}
	writeBenchResults(t, out, results)
}

// waitConfigVersion waits for config/machine to reach version (watched, as waitNetworkApplied).
func (c *configMachine) waitConfigVersion(t *testing.T, version uint64) {
	t.Helper()
	c.waitUntil(t, machineConfigType, machineConfigID, fmt.Sprintf("version %d", version), func(res resource.Resource) bool {
		return res.Version >= version
	})
}

// percentiles are the median and 90th percentile of samples, in milliseconds.
func percentiles(samples []time.Duration) map[string]float64 {
	sorted := append([]time.Duration(nil), samples...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return map[string]float64{"median": ms(sorted[len(sorted)/2]), "p90": ms(sorted[len(sorted)*9/10])}
}

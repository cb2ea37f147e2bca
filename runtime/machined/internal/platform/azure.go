package platform

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// azure reads the provisioning DVD and the instance metadata service (IMDS).
//
// Custom data is not in IMDS: Azure hands it to the VM base64-encoded in ovf-env.xml, on a
// UDF-formatted DVD it attaches for provisioning. The DVD's label is not documented (it has
// been seen as "rd_rdfe_stable.<build>"), so the drive is found by filesystem type and by
// holding ovf-env.xml rather than by label. IMDS gives the VM ID, the computer name and,
// when no custom data was given, the newer "user data" (compute.userData, also base64).
//
// Azure marks a VM failed unless it reports Ready to the WireServer within the provisioning
// timeout: ReportReady does that once machined is up.
type azure struct{}

// WireServerURL is Azure's WireServer (the host fabric's endpoint), reached on port 80.
const WireServerURL = "http://168.63.129.16"

const (
	azureIMDSPath    = "/metadata/instance?api-version=2021-02-01"
	azureWireVersion = "2012-11-30"
)

func (azure) Name() string { return "azure" }

func (azure) Fetch(ctx context.Context, env Env) (Facts, error) {
	return fromService(ctx, env, "azure", func(ctx context.Context, fe *fetcher) (Facts, error) {
		fe.retryStatus = []int{http.StatusGone} // IMDS answers 410 while the VM is still being set up
		f := newFacts("azure")
		var sources []string

		files, device, found, err := readDrive("azure", env, DriveQuery{FSTypes: []string{"udf", "iso9660"}, Files: []string{"ovf-env.xml"}})
		if err != nil {
			return Facts{}, err
		}
		if ovf, ok := files["ovf-env.xml"]; found && ok {
			env, err := parseAzureOVF(ovf)
			if err != nil {
				return Facts{}, err
			}
			f.setUserData(env.customData)
			f.setHostname(env.hostname, "ovf-env.xml")
			sources = append(sources, "provisioning DVD "+device)
		}

		// compute.userData is at most 64 KiB: the document stays well within MaxDocument.
		body, err := fe.get(ctx, azureIMDSPath, "IMDS metadata/instance", MaxDocument, map[string]string{"Metadata": "true"})
		if err != nil {
			return Facts{}, err
		}
		imds, err := parseAzureIMDS(body)
		if err != nil {
			return Facts{}, err
		}
		if f.UserData != nil && len(imds.userData) > 0 {
			f.warn("IMDS compute.userData ignored: the custom data in ovf-env.xml is used")
		}
		f.setUserData(imds.userData)
		f.setHostname(imds.computerName, "IMDS compute.osProfile.computerName")
		f.setHostname(imds.name, "IMDS compute.name")
		f.setInstanceID(imds.vmID, "IMDS compute.vmId")
		f.Source = "azure " + strings.Join(append(sources, "IMDS "+fe.base), " + ")
		return f.Facts, nil
	})
}

type azureOVFFacts struct {
	hostname   string
	customData []byte // nil: none
}

// parseAzureOVF reads HostName and CustomData from ovf-env.xml. Elements are matched by
// local name: Azure writes them with namespace prefixes (ns1:, wa:) that vary.
func parseAzureOVF(data []byte) (azureOVFFacts, error) {
	const doc = "ovf-env.xml"
	var env struct {
		Provisioning struct {
			Linux struct {
				HostName   string `xml:"HostName"`
				CustomData string `xml:"CustomData"`
			} `xml:"LinuxProvisioningConfigurationSet"`
		} `xml:"ProvisioningSection"`
	}
	if err := decodeXML("azure", doc, data, "Environment", &env); err != nil {
		return azureOVFFacts{}, err
	}
	out := azureOVFFacts{hostname: env.Provisioning.Linux.HostName}
	custom, err := decodeBase64(env.Provisioning.Linux.CustomData)
	if err != nil {
		return azureOVFFacts{}, docError("azure", doc, fmt.Errorf("CustomData: %v", err))
	}
	out.customData = custom
	return out, nil
}

type azureIMDSFacts struct {
	name, computerName, vmID string
	userData                 []byte
}

// parseAzureIMDS reads the fields used from IMDS's instance document.
func parseAzureIMDS(data []byte) (azureIMDSFacts, error) {
	const doc = "IMDS metadata/instance"
	var inst struct {
		Compute struct {
			Name      text `json:"name"`
			VMID      text `json:"vmId"`
			UserData  text `json:"userData"`
			OSProfile struct {
				ComputerName text `json:"computerName"`
			} `json:"osProfile"`
		} `json:"compute"`
	}
	if err := decodeJSON("azure", doc, data, &inst); err != nil {
		return azureIMDSFacts{}, err
	}
	userData, err := decodeBase64(string(inst.Compute.UserData))
	if err != nil {
		return azureIMDSFacts{}, docError("azure", doc, fmt.Errorf("compute.userData: %v", err))
	}
	return azureIMDSFacts{name: string(inst.Compute.Name), computerName: string(inst.Compute.OSProfile.ComputerName),
		vmID: string(inst.Compute.VMID), userData: userData}, nil
}

// ReportReady tells the WireServer that provisioning succeeded: it reads the goal state for
// the container and role instance IDs and the incarnation, then posts a health report.
func (azure) ReportReady(ctx context.Context, env Env, facts Facts) error {
	ctx, cancel := env.withDeadline(ctx)
	defer cancel()
	wire, err := serviceURL(env.WireServerURL, WireServerURL)
	if err != nil {
		return fmt.Errorf("azure: WireServerURL: %v", err)
	}
	fe := &fetcher{platform: "azure", base: wire, client: boundedClient(env.Client), sleep: sleeper(env.Sleep)}
	body, err := fe.get(ctx, "/machine?comp=goalstate", "WireServer goal state", MaxDocument, map[string]string{"x-ms-version": azureWireVersion})
	if err != nil {
		return err
	}
	gs, err := parseGoalState(body)
	if err != nil {
		return err
	}
	_, err = fe.do(ctx, request{method: http.MethodPost, path: "/machine?comp=health", doc: "WireServer health report",
		body: healthReport(gs), header: map[string]string{
			"x-ms-version":    azureWireVersion,
			"x-ms-agent-name": "kiln-machined",
			"Content-Type":    "text/xml; charset=utf-8",
		}})
	return err
}

// goalState is what a health report must name.
type goalState struct {
	Incarnation string `xml:"Incarnation"`
	Container   struct {
		ContainerID string `xml:"ContainerId"`
		Roles       []struct {
			InstanceID string `xml:"InstanceId"`
		} `xml:"RoleInstanceList>RoleInstance"`
	} `xml:"Container"`
}

func parseGoalState(data []byte) (goalState, error) {
	const doc = "WireServer goal state"
	var gs goalState
	if err := decodeXML("azure", doc, data, "GoalState", &gs); err != nil {
		return goalState{}, err
	}
	gs.Incarnation = strings.TrimSpace(gs.Incarnation)
	gs.Container.ContainerID = strings.TrimSpace(gs.Container.ContainerID)
	switch {
	case gs.Incarnation == "" || strings.Trim(gs.Incarnation, "0123456789") != "" || len(gs.Incarnation) > 19:
		return goalState{}, docError("azure", doc, fmt.Errorf("Incarnation %s is not a number", quoteShort(gs.Incarnation)))
	case gs.Container.ContainerID == "":
		return goalState{}, docError("azure", doc, errors.New("no Container/ContainerId"))
	case len(gs.Container.Roles) == 0 || strings.TrimSpace(gs.Container.Roles[0].InstanceID) == "":
		return goalState{}, docError("azure", doc, errors.New("no Container/RoleInstanceList/RoleInstance/InstanceId"))
	}
	gs.Container.Roles[0].InstanceID = strings.TrimSpace(gs.Container.Roles[0].InstanceID)
	return gs, nil
}

// healthReport is the "Ready" report for the goal state's first role instance.
func healthReport(gs goalState) []byte {
	esc := func(s string) string {
		var b bytes.Buffer
		_ = xml.EscapeText(&b, []byte(s))
		return b.String()
	}
	return []byte(`<?xml version="1.0" encoding="utf-8"?>` +
		`<Health xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema">` +
		`<GoalStateIncarnation>` + esc(gs.Incarnation) + `</GoalStateIncarnation>` +
		`<Container><ContainerId>` + esc(gs.Container.ContainerID) + `</ContainerId>` +
		`<RoleInstanceList><Role><InstanceId>` + esc(gs.Container.Roles[0].InstanceID) + `</InstanceId>` +
		`<Health><State>Ready</State></Health></Role></RoleInstanceList></Container></Health>`)
}

// decodeXML decodes a bounded XML document whose root element is root (any namespace).
func decodeXML(platform, doc string, data []byte, root string, v interface{}) error {
	if len(data) > MaxDocument {
		return docError(platform, doc, fmt.Errorf("%d bytes is more than the %d allowed", len(data), MaxDocument))
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return docError(platform, doc, fmt.Errorf("invalid XML: %v", err))
		}
		if start, ok := tok.(xml.StartElement); ok {
			if start.Name.Local != root {
				return docError(platform, doc, fmt.Errorf("the root element is <%s>, not <%s>", start.Name.Local, root))
			}
			if err := dec.DecodeElement(v, &start); err != nil {
				return docError(platform, doc, fmt.Errorf("invalid XML: %v", err))
			}
			return nil
		}
	}
}

// decodeBase64 decodes standard base64, ignoring the line breaks and spaces XML and JSON
// writers put into long values; "" is nil (no data).
func decodeBase64(s string) ([]byte, error) {
	s = strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
			return -1
		}
		return r
	}, s)
	if s == "" {
		return nil, nil
	}
	data, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not valid base64: %v", err)
	}
	if len(data) == 0 {
		return nil, nil
	}
	return data, nil
}

package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Restart policies.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure"
	RestartNever     = "never"
)

// Service types: when a service counts as started for the services that start after it.
const (
	TypeSimple  = "simple"  // as soon as it runs (daemons)
	TypeOneshot = "oneshot" // once it has exited successfully (setup steps)
)

// ServiceSpec defines one supervised service, in a service file or the machine config.
type ServiceSpec struct {
	Name    string    `json:"name"`
	Command string    `json:"command"`
	Args    []string  `json:"args,omitempty"`
	Env     StringMap `json:"env,omitempty"`
	Type    string    `json:"type,omitempty"`    // simple (default): ready once started; oneshot: once exited 0
	Restart string    `json:"restart,omitempty"` // always | on-failure (default) | never
	After   []string  `json:"after,omitempty"`   // services that must have started first
	Source  string    `json:"-"`                 // where it was defined, for messages
}

// StringMap is an env block: YAML's `PORT: 8080` is a number, but env values are strings.
type StringMap map[string]string

// UnmarshalJSON takes strings, numbers and booleans, each as its text.
func (m *StringMap) UnmarshalJSON(data []byte) error {
	var raw map[string]interface{}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	*m = StringMap{}
	for k, v := range raw {
		switch v := v.(type) {
		case string:
			(*m)[k] = v
		case json.Number, bool:
			(*m)[k] = fmt.Sprint(v)
		default:
			return fmt.Errorf("env %s: want a string, got %T", k, v)
		}
	}
	return nil
}

var serviceNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Validate checks a service definition and fills in the defaults of Type and Restart.
func (s *ServiceSpec) Validate() error {
	if !serviceNameRE.MatchString(s.Name) || s.Name == "machined" {
		return fmt.Errorf("service name %q: want lower-case letters, digits, '-', '_' or '.' (and not \"machined\")", s.Name)
	}
	if !strings.HasPrefix(s.Command, "/") {
		return fmt.Errorf("service %s: command %q must be an absolute path", s.Name, s.Command)
	}
	switch s.Type {
	case "":
		s.Type = TypeSimple
	case TypeSimple, TypeOneshot:
	default:
		return fmt.Errorf("service %s: type %q: want simple or oneshot", s.Name, s.Type)
	}
	switch s.Restart {
	case "":
		s.Restart = RestartOnFailure
	case RestartAlways, RestartOnFailure, RestartNever:
	default:
		return fmt.Errorf("service %s: restart %q: want always, on-failure or never", s.Name, s.Restart)
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("service %s: bad env name %q", s.Name, k)
		}
	}
	for _, dep := range s.After {
		if dep == s.Name {
			return fmt.Errorf("service %s: cannot start after itself", s.Name)
		}
	}
	return nil
}

// MergeServices lays the machine config's services over the extensions': a config
// service with an extension service's name replaces it (to change its args or env).
func MergeServices(fromExtensions, fromConfig []ServiceSpec) []ServiceSpec {
	byName := map[string]ServiceSpec{}
	for _, s := range fromExtensions {
		if prev, dup := byName[s.Name]; dup {
			s.Source = prev.Source + ", replaced by " + s.Source
		}
		byName[s.Name] = s
	}
	for _, s := range fromConfig {
		if s.Source == "" {
			s.Source = "machine config"
		}
		byName[s.Name] = s
	}
	out := make([]ServiceSpec, 0, len(byName))
	for _, s := range byName {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// checkDependencies refuses unknown dependencies and cycles, which would otherwise leave
// services waiting forever with no word on the console.
func checkDependencies(specs []ServiceSpec) error {
	byName := map[string]*ServiceSpec{}
	for i := range specs {
		byName[specs[i].Name] = &specs[i]
	}
	for _, s := range specs {
		for _, dep := range s.After {
			if byName[dep] == nil {
				return fmt.Errorf("service %s starts after %q, which is not defined", s.Name, dep)
			}
		}
	}
	const (
		unvisited = iota
		visiting
		done
	)
	state := map[string]int{}
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		switch state[name] {
		case visiting:
			return fmt.Errorf("services depend on each other in a cycle: %s", strings.Join(append(path, name), " -> "))
		case done:
			return nil
		}
		state[name] = visiting
		for _, dep := range byName[name].After {
			if err := visit(dep, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = done
		return nil
	}
	for _, s := range specs {
		if err := visit(s.Name, nil); err != nil {
			return err
		}
	}
	return nil
}

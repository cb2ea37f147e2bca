package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"kiln/machined/internal/supervisor"
)

// servicesDir is where extensions drop service definitions, one service per file.
const servicesDir = "/usr/local/lib/kiln/services"

// loadServiceFile reads one service file; the name defaults to the file's base name.
func loadServiceFile(path string) (supervisor.ServiceSpec, error) {
	var s supervisor.ServiceSpec
	data, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := decodeDocument(path, data, &s, true); err != nil {
		return s, err
	}
	if s.Name == "" {
		s.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	s.Source = path
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("%s: %v", path, err)
	}
	return s, nil
}

// loadServiceDir reads *.json, *.yaml and *.yml under dir in name order. A bad file is
// reported and skipped: one broken extension must not keep the others' services down.
func loadServiceDir(dir string) ([]supervisor.ServiceSpec, []error) {
	var specs []supervisor.ServiceSpec
	var errs []error
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			errs = append(errs, err)
		}
		return nil, errs
	}
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".json", ".yaml", ".yml":
		default:
			continue
		}
		s, err := loadServiceFile(filepath.Join(dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		specs = append(specs, s)
	}
	return specs, errs
}

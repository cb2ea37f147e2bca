package platform

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveDir is a fake metadata service answering GETs with the files under dir (the URL path
// is the file's path); a missing file is 404. guard, when set, sees every request first and
// answers it itself by returning false.
func serveDir(t *testing.T, dir string, guard func(w http.ResponseWriter, r *http.Request) bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if guard != nil && !guard(w, r) {
			return
		}
		if r.Method != http.MethodGet {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(r.URL.Path)))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(data)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fakeDrive is a drive with the given label, filesystem type and files: it answers queries
// the way machined's ReadDrive is documented to.
type fakeDrive struct {
	label, fstype, device string
	files                 map[string][]byte
	queries               []DriveQuery
}

func (d *fakeDrive) read(q DriveQuery) (map[string][]byte, string, error) {
	d.queries = append(d.queries, q)
	match := false
	for _, l := range q.Labels {
		match = match || strings.EqualFold(l, d.label)
	}
	for _, fs := range q.FSTypes {
		if fs == d.fstype {
			for _, name := range q.Files {
				_, has := d.files[name]
				match = match || has
			}
		}
	}
	if !match {
		return nil, "", ErrNoDrive
	}
	out := map[string][]byte{}
	for _, name := range q.Files {
		if data, ok := d.files[name]; ok {
			out[name] = data
		}
	}
	return out, d.device, nil
}

// driveFromDir makes a fakeDrive of the files under dir.
func driveFromDir(t *testing.T, dir, label, fstype, device string) *fakeDrive {
	t.Helper()
	d := &fakeDrive{label: label, fstype: fstype, device: device, files: map[string][]byte{}}
	err := filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		d.files[filepath.ToSlash(rel)], err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// sleepLog records the backoff Fetch asked for, without sleeping.
type sleepLog struct {
	mu     sync.Mutex
	sleeps []time.Duration
}

func (s *sleepLog) sleep(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sleeps = append(s.sleeps, d)
}

func (s *sleepLog) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.sleeps...)
}

// testEnv points at a fake service with a short deadline and no real sleeping.
func testEnv(url string) Env {
	return Env{BaseURL: url, Sleep: func(time.Duration) {}, Deadline: 5 * time.Second}
}

// loggedEnv is testEnv with its sleeps (the retries' backoff) logged.
func loggedEnv(url string) (Env, *sleepLog) {
	log := &sleepLog{}
	env := testEnv(url)
	env.Sleep = log.sleep
	return env, log
}

func readTestdata(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mustLookup(t *testing.T, name string) Platform {
	t.Helper()
	p, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func fetch(t *testing.T, name string, env Env) Facts {
	t.Helper()
	facts, err := mustLookup(t, name).Fetch(context.Background(), env)
	if err != nil {
		t.Fatalf("%s: Fetch: %v", name, err)
	}
	return facts
}

// wantFacts compares exactly, showing both sides as JSON when they differ.
func wantFacts(t *testing.T, got, want Facts) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Fatalf("facts differ\ngot:  %s\nwant: %s", g, w)
	}
}

func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

// writeTree writes files (path: content) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

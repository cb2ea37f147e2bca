package platform

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func TestRetry5xxThenSuccess(t *testing.T) {
	var calls int32
	srv := serveDir(t, "testdata/digital-ocean", func(w http.ResponseWriter, r *http.Request) bool {
		if atomic.AddInt32(&calls, 1) <= 2 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return false
		}
		return true
	})
	env, log := loggedEnv(srv.URL)
	facts := fetch(t, "digital-ocean", env)
	if facts.Hostname != "sample-droplet" {
		t.Errorf("hostname %q", facts.Hostname)
	}
	if got, want := log.get(), []time.Duration{250 * time.Millisecond, 500 * time.Millisecond}; !reflect.DeepEqual(got, want) {
		t.Errorf("backoff %v, want %v", got, want)
	}
}

func TestRetryGivesUp(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "broken", http.StatusInternalServerError)
	}))
	defer srv.Close()
	env, log := loggedEnv(srv.URL)
	_, err := mustLookup(t, "vultr").Fetch(context.Background(), env)
	wantErr(t, err, "vultr: v1.json: HTTP 500", "gave up after 8 attempts")
	want := []time.Duration{250, 500, 1000, 2000, 4000, 5000, 5000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if got := log.get(); !reflect.DeepEqual(got, want) {
		t.Errorf("backoff %v, want %v", got, want)
	}
}

func TestConnectionErrorsAreRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	env, log := loggedEnv("http://" + addr)
	_, err = mustLookup(t, "hcloud").Fetch(context.Background(), env)
	wantErr(t, err, "hcloud: hetzner/v1/metadata", "refused", "gave up")
	if n := len(log.get()); n != maxAttempts-1 {
		t.Errorf("%d retries", n)
	}
}

func TestNoRetryOn4xx(t *testing.T) {
	for _, code := range []int{http.StatusNotFound, http.StatusForbidden, http.StatusBadRequest} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
		}))
		env, log := loggedEnv(srv.URL)
		_, err := mustLookup(t, "digital-ocean").Fetch(context.Background(), env)
		srv.Close()
		wantErr(t, err, "digital-ocean: metadata/v1.json", strconv.Itoa(code))
		if len(log.get()) != 0 {
			t.Errorf("%d was retried", code)
		}
	}
}

// A service that accepts the request and then says nothing: the deadline ends Fetch.
func TestSlowServer(t *testing.T) {
	for _, mode := range []string{"no headers", "headers, then a stalled body"} {
		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if mode != "no headers" {
				w.Header().Set("Content-Length", "1000")
				_, _ = w.Write([]byte(`{"hostname": "`))
				w.(http.Flusher).Flush()
			}
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		env := Env{BaseURL: srv.URL, Deadline: 300 * time.Millisecond} // the real sleep: it must end with the deadline
		start := time.Now()
		_, err := mustLookup(t, "openstack").Fetch(context.Background(), env)
		elapsed := time.Since(start)
		close(release)
		srv.Close()
		wantErr(t, err, "openstack: openstack/latest/meta_data.json")
		if elapsed > 2*time.Second {
			t.Errorf("%s: Fetch took %v with a 300ms deadline", mode, elapsed)
		}
	}
}

// A 32 MiB answer is refused, whether announced or streamed, without holding it in memory.
func TestOversizedAnswer(t *testing.T) {
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = 'x'
	}
	for _, announced := range []bool{true, false} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if announced {
				w.Header().Set("Content-Length", strconv.Itoa(32<<20))
			}
			for sent := 0; sent < 32<<20; sent += len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}))
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := mustLookup(t, "digital-ocean").Fetch(context.Background(), testEnv(srv.URL))
		runtime.ReadMemStats(&after)
		srv.Close()
		wantErr(t, err, "digital-ocean: metadata/v1.json: answer too large")
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 12<<20 {
			t.Errorf("announced=%v: %d MiB allocated for a 1 MiB limit", announced, grew>>20)
		}
	}

	// user data has its own, larger limit
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			_, _ = w.Write([]byte("token"))
			return
		}
		for sent := 0; sent < 32<<20; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer big.Close()
	// 16 MiB read under the race detector on a loaded machine can take longer than a request
	// may; the limit, not the clock, is what this checks
	defer func(d time.Duration) { requestTimeout = d }(requestTimeout)
	requestTimeout = time.Minute
	env := testEnv(big.URL)
	env.Deadline = time.Minute // the whole fetch's bound too, not only each request's
	_, err := mustLookup(t, "aws").Fetch(context.Background(), env)
	wantErr(t, err, "aws: latest/user-data: answer too large", strconv.Itoa(MaxUserData))
}

func TestRedirects(t *testing.T) {
	other := serveDir(t, "testdata/digital-ocean", nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metadata/v1.json":
			http.Redirect(w, r, other.URL+"/metadata/v1.json", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	env, log := loggedEnv(srv.URL)
	_, err := mustLookup(t, "digital-ocean").Fetch(context.Background(), env)
	wantErr(t, err, "digital-ocean: metadata/v1.json", "refused")
	if len(log.get()) != 0 {
		t.Error("a refused redirect was retried")
	}

	// on the same host, a redirect is followed
	same := serveDir(t, "testdata/digital-ocean", func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/metadata/v1.json" {
			http.Redirect(w, r, "/metadata/v1.json/", http.StatusMovedPermanently)
			return false
		}
		if r.URL.Path == "/metadata/v1.json/" {
			r.URL.Path = "/metadata/v1.json"
		}
		return true
	})
	if facts := fetch(t, "digital-ocean", testEnv(same.URL)); facts.InstanceID != "2756294" {
		t.Errorf("instance ID %q", facts.InstanceID)
	}
}

func TestBadBaseURL(t *testing.T) {
	for _, name := range []string{"aws", "gcp", "azure", "digital-ocean", "hcloud", "vultr", "openstack"} {
		_, err := mustLookup(t, name).Fetch(context.Background(), Env{BaseURL: "ftp://example"})
		wantErr(t, err, name+": BaseURL")
	}
	err := mustLookup(t, "azure").ReportReady(context.Background(), Env{WireServerURL: "168.63.129.16"}, Facts{})
	wantErr(t, err, "azure: WireServerURL")
}

// Azure IMDS answers 410 while the VM is being set up: that is retried, unlike other 4xx.
func TestAzureIMDSGoneIsRetried(t *testing.T) {
	var calls int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if atomic.AddInt32(&calls, 1) == 1 {
			w.WriteHeader(http.StatusGone)
			return
		}
		_, _ = w.Write(readTestdata(t, "azure/imds-instance.json"))
	}))
	defer srv.Close()
	env, log := loggedEnv(srv.URL)
	if facts := fetch(t, "azure", env); facts.InstanceID != "02aab8a4-74ef-476e-8182-f6d2ba4166a6" || len(log.get()) != 1 {
		t.Errorf("facts %+v after %d retries", facts, len(log.get()))
	}
}

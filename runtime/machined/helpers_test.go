package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"kiln/machined/internal/disk"
	"math/big"
	"net"
	"os"
	"testing"
	"time"
)

// waitFor is internal/disk's, for the tests here.
var waitFor = disk.WaitFor

func fmtJSON(t *testing.T, v interface{}) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// benchOutput is the file a measuring test writes its figures to, named by the environment
// variable env that script sets; without it the test is skipped, so go test ./... measures nothing.
func benchOutput(t *testing.T, env, script string) string {
	t.Helper()
	out := os.Getenv(env)
	if out == "" {
		t.Skipf("set %s=FILE to measure (%s)", env, script)
	}
	return out
}

// writeBenchResults writes a measuring test's figures to out as indented JSON.
func writeBenchResults(t *testing.T, out string, results map[string]interface{}) {
	t.Helper()
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testCA is a throwaway certificate authority for the API tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

var serial int64 = 1

func newTestCA(t testing.TB, name string) *testCA {
	t.Helper()
	cert, key := certify(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))}
}

// certify makes the certificate tmpl describes, with the next serial number and valid from an
// hour ago for two hours, for key (nil: a new one), signed by parent (nil: self-signed).
func certify(t testing.TB, tmpl *x509.Certificate, key *ecdsa.PrivateKey, parent *testCA) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	issuer, signer := tmpl, key
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// certSpec is one certificate for the auth tests: its role(s), extended key usages, and key
// (nil: a new one).
type certSpec struct {
	name   string
	orgs   []string
	usages []x509.ExtKeyUsage
	key    *ecdsa.PrivateKey
	server bool // names 127.0.0.1, so a client can verify it as the machine
}

type issued struct {
	certPEM, keyPEM string
	cert            *x509.Certificate
	key             *ecdsa.PrivateKey
}

func (ca *testCA) issueSpec(t testing.TB, s certSpec) issued {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:  pkix.Name{CommonName: s.name, Organization: s.orgs},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: s.usages,
	}
	if s.server {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	cert, key := certify(t, tmpl, s.key, ca)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return issued{
		certPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})),
		keyPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})),
		cert:    cert, key: key,
	}
}

// issue returns PEM certificate and key for a server (127.0.0.1) or a client (role admin).
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM string) {
	t.Helper()
	s := certSpec{name: name, orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		s = certSpec{name: name, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, server: true}
	}
	c := ca.issueSpec(t, s)
	return c.certPEM, c.keyPEM
}

func (ca *testCA) clientTLS(t *testing.T, serverCA *testCA, withCert bool) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(serverCA.pem))
	cfg := &tls.Config{RootCAs: pool}
	if withCert {
		c, k := ca.issue(t, "client", false)
		pair, err := tls.X509KeyPair([]byte(c), []byte(k))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

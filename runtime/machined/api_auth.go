package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
)

// role is what a client may do; each role may do everything the roles below it may.
// The zero value is no role: it may do nothing.
type role int

const (
	roleNone     role = iota
	roleReader        // status, services, resources, logs
	roleOperator      // reader's, plus reboot, rollback and upgrade (keeping /var)
	roleAdmin         // everything: poweroff, and upgrades that wipe /var
)

// roleNames are the only Organization values a client certificate may carry: the role,
// as Talos keeps it (kiln secrets generate writes exactly one).
var roleNames = map[string]role{"reader": roleReader, "operator": roleOperator, "admin": roleAdmin}

func (r role) String() string {
	for name, known := range roleNames {
		if known == r {
			return name
		}
	}
	return "none"
}

// apiTLS is the server side of the API's mutual TLS: the listener's config, the machine's own
// certificate and the client CAs. A config applied live may replace either (setCert,
// setClientCAs): each handshake takes the ones in place then (handshake), connections already
// open keep theirs, and no client may present the key of the machine's certificate in place.
type apiTLS struct {
	config    *tls.Config
	clientCAs atomic.Pointer[x509.CertPool]
	own       atomic.Pointer[ownCert]
}

// ownCert is the machine's certificate: the pair TLS presents, and its parsed leaf.
type ownCert struct {
	pair tls.Certificate
	leaf *x509.Certificate
}

func parseOwnCert(certPEM, keyPEM string) (*ownCert, error) {
	pair, err := tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		return nil, fmt.Errorf("cert/key: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("cert: %v", err)
	}
	return &ownCert{pair: pair, leaf: leaf}, nil
}

// serverKey is the machine's public key now (SubjectPublicKeyInfo DER).
func (t *apiTLS) serverKey() []byte { return t.own.Load().leaf.RawSubjectPublicKeyInfo }

// certName says which certificate the API presents: its subject's common name and serial.
func certName(t *apiTLS) string {
	leaf := t.own.Load().leaf
	return fmt.Sprintf("%q (serial %s)", leaf.Subject.CommonName, leaf.SerialNumber)
}

// setCert puts a new certificate and key in place for the handshakes from now on; connections
// already open keep theirs.
func (t *apiTLS) setCert(certPEM, keyPEM string) error {
	own, err := parseOwnCert(certPEM, keyPEM)
	if err != nil {
		return err
	}
	t.own.Store(own)
	return nil
}

// setClientCAs makes the handshakes from now on take client certificates that chain to caPEM's
// certificates (one CA, or several while clients move from an old CA to a new one).
func (t *apiTLS) setClientCAs(caPEM string) error {
	pool, err := clientCAPool(caPEM)
	if err != nil {
		return err
	}
	t.clientCAs.Store(pool)
	return nil
}

func clientCAPool(caPEM string) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, fmt.Errorf("client_ca: no PEM certificate found")
	}
	return pool, nil
}

// caNames names the CAs of a PEM bundle by their subjects' common names, for the console.
func caNames(caPEM string) string {
	var names []string
	for rest := []byte(caPEM); ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			names = append(names, fmt.Sprintf("%q", c.Subject.CommonName))
		}
	}
	return strings.Join(names, " or ")
}

// chainsAsClient says whether chain (a client's certificate, then the intermediates it sent)
// would pass the handshake with pool as the client CAs.
func chainsAsClient(chain []*x509.Certificate, pool *x509.CertPool) bool {
	if len(chain) == 0 {
		return false
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// handshake is the config of one TLS handshake: the certificate and client CAs in place now.
func (t *apiTLS) handshake() *tls.Config {
	own := t.own.Load()
	return &tls.Config{
		Certificates: []tls.Certificate{own.pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    t.clientCAs.Load(),
		MinVersion:   tls.VersionTLS12,
	}
}

// clientCA is the CA that signs clients: client_ca, or ca, its older name (same meaning).
func (a APIConfig) clientCA() (string, error) {
	if a.ClientCA != "" && a.CA != "" && a.ClientCA != a.CA {
		return "", errors.New("client_ca and ca are both set and differ (ca is the older name of client_ca: keep one)")
	}
	if a.ClientCA != "" {
		return a.ClientCA, nil
	}
	return a.CA, nil
}

// tlsConfig builds the API's mutual-TLS server config: clients must present a certificate that
// chains to the client CA, or the handshake fails. What the certificate may do (its extended
// key usage, its key, its role) is checked per request by authorize.
func (a APIConfig) tlsConfig() (*apiTLS, error) {
	caPEM, err := a.clientCA()
	if err != nil {
		return nil, err
	}
	if caPEM == "" || a.Cert == "" || a.Key == "" {
		return nil, fmt.Errorf("client_ca, cert and key are all required to turn the API on")
	}
	own, err := parseOwnCert(a.Cert, a.Key)
	if err != nil {
		return nil, err
	}
	pool, err := clientCAPool(caPEM)
	if err != nil {
		return nil, err
	}
	t := &apiTLS{}
	t.own.Store(own)
	t.clientCAs.Store(pool)
	t.config = &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return t.handshake(), nil },
		MinVersion:         tls.VersionTLS12,
	}
	return t, nil
}

// sharedCA says whether the client CA also vouches for this machine's own certificate: the
// single-CA setup of older docs, where any machine's certificate chains as a client's too.
func (t *apiTLS) sharedCA() bool {
	_, err := t.own.Load().leaf.Verify(x509.VerifyOptions{Roots: t.clientCAs.Load(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

func (a APIConfig) listen() string {
	if a.Listen == "" {
		return ":50000"
	}
	return a.Listen
}

// identity is who a request comes from: the client certificate's common name and role.
type identity struct {
	name string
	role role
}

// clientIdentity checks a verified client certificate beyond its chain: it must say it is a
// client (the clientAuth extended key usage, named: Go's verifier takes a certificate with no
// extended key usage, or "any", as fit for everything), must not be a server's, must not hold
// the machine's own key, and must carry exactly one known role in its Organization.
func clientIdentity(leaf *x509.Certificate, serverKey []byte) (identity, error) {
	id := identity{name: leaf.Subject.CommonName}
	client, server := false, false
	for _, usage := range leaf.ExtKeyUsage {
		switch usage {
		case x509.ExtKeyUsageClientAuth:
			client = true
		case x509.ExtKeyUsageServerAuth:
			server = true
		}
	}
	switch {
	case bytes.Equal(leaf.RawSubjectPublicKeyInfo, serverKey):
		return id, errors.New("this certificate holds the machine's own key: a machine's key is never a client")
	case !client:
		return id, errors.New("the certificate is not a client certificate (it has no clientAuth extended key usage); make one with kiln secrets client")
	case server:
		return id, errors.New("the certificate is a server's too (serverAuth): a machine's certificate is never a client")
	}
	orgs := leaf.Subject.Organization
	if len(orgs) != 1 {
		return id, fmt.Errorf("the certificate names %d roles (Organization): want exactly one of admin, operator, reader", len(orgs))
	}
	r, ok := roleNames[orgs[0]]
	if !ok {
		return id, fmt.Errorf("the certificate's role (Organization) %q is not admin, operator or reader", orgs[0])
	}
	id.role = r
	return id, nil
}

type identityKey struct{}

// authorize admits a request only from a client certificate clientIdentity accepts, and puts
// its identity in the request's context for the routes' role checks. refused hears each refusal.
func authorize(serverKey func() []byte, refused func(string), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			forbid(w, r, refused, "", "no verified client certificate")
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		id, err := clientIdentity(leaf, serverKey())
		if err != nil {
			forbid(w, r, refused, id.name, err.Error())
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// requireRole runs h only for a client whose role is need or above.
func requireRole(need role, refused func(string), h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := requestIdentity(r)
		if id.role < need {
			forbid(w, r, refused, id.name, fmt.Sprintf("role %s may not %s %s: it needs %s", id.role, r.Method, r.URL.Path, need))
			return
		}
		h(w, r)
	}
}

func requestIdentity(r *http.Request) identity {
	id, _ := r.Context().Value(identityKey{}).(identity)
	return id
}

// forbid answers 403 with the reason, and reports it (rate-limited) for the machine's log.
func forbid(w http.ResponseWriter, r *http.Request, refused func(string), who, reason string) {
	if refused != nil {
		refused(fmt.Sprintf("refused %q from %s: %s %s: %s", who, r.RemoteAddr, r.Method, r.URL.Path, reason))
	}
	writeJSON(w, http.StatusForbidden, map[string]string{"error": "forbidden: " + reason})
}

package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"kiln/machined/internal/redact"
)

const maxTokenBody = 64 << 10

// challenge is a parsed `WWW-Authenticate: Bearer realm=...,service=...,scope=...`.
type challenge struct {
	realm, service, scope string
}

// bearerChallenge finds a Bearer challenge among a 401's WWW-Authenticate headers.
func bearerChallenge(h http.Header) (challenge, bool) {
	for _, v := range h.Values("WWW-Authenticate") {
		v = strings.TrimSpace(v)
		if len(v) < 7 || !strings.EqualFold(v[:7], "bearer ") {
			continue
		}
		params := authParams(v[7:])
		if params["realm"] == "" {
			continue
		}
		return challenge{realm: params["realm"], service: params["service"], scope: params["scope"]}, true
	}
	return challenge{}, false
}

// authParams parses RFC 7235 auth-params: key=token or key="quoted \"string\"", comma separated.
// Quoted values may hold commas (scopes do: "repository:a:pull,push").
func authParams(s string) map[string]string {
	params := map[string]string{}
	for len(params) < 16 {
		s = strings.TrimLeft(s, " \t,")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			break
		}
		key := strings.ToLower(strings.TrimSpace(s[:eq]))
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val strings.Builder
		if strings.HasPrefix(s, `"`) {
			i := 1
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
			}
			s = s[min(i+1, len(s)):]
		} else {
			end := strings.IndexByte(s, ',')
			if end < 0 {
				end = len(s)
			}
			val.WriteString(strings.TrimSpace(s[:end]))
			s = s[end:]
		}
		if _, dup := params[key]; !dup {
			params[key] = val.String()
		}
	}
	return params
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// fetchToken gets an anonymous pull token from the challenge's realm. The realm is the
// registry's say-so, so it gets the same scheme rule as the registry itself, and the token must
// be a plausible header value before it is sent anywhere.
func (r *Registry) fetchToken(ctx context.Context, ch challenge) (string, error) {
	u, err := url.Parse(ch.realm)
	if err != nil {
		return "", fmt.Errorf("token realm %s: %v", quote(ch.realm), err)
	}
	if err := checkScheme(u, r.Insecure); err != nil {
		return "", fmt.Errorf("token realm: %w", err)
	}
	q := u.Query()
	if ch.service != "" {
		q.Set("service", ch.service)
	}
	scope := ch.scope
	if scope == "" {
		scope = "repository:" + r.Repo + ":pull"
	}
	q.Set("scope", scope)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", err
	}
	if r.UserAgent != "" {
		req.Header.Set("User-Agent", r.UserAgent)
	}
	resp, err := r.httpClient().Do(req)
	if err != nil {
		return "", fmt.Errorf("token from %s: %w", redact.URL(u), transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token: %w", statusError(resp))
	}
	body, err := readLimited(resp.Body, maxTokenBody, "token response")
	if err != nil {
		return "", err
	}
	var t struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &t); err != nil {
		return "", fmt.Errorf("token response from %s is not JSON: %v", redact.URL(u), err)
	}
	tok := t.Token
	if tok == "" {
		tok = t.AccessToken
	}
	if tok == "" {
		return "", fmt.Errorf("token response from %s has no token", redact.URL(u))
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= 0x20 || tok[i] >= 0x7f {
			return "", errors.New("token response holds a token with spaces or control characters")
		}
	}
	return tok, nil
}

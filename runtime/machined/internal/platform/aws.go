package platform

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// aws reads EC2's instance metadata service with IMDSv2: a PUT gets a session token, and
// every GET carries it. IMDSv1 (plain GETs) is what SSRF bugs in software on the instance can
// reach, so it is used only when Env.AllowIMDSv1 is set and the token request is refused.
type aws struct{ noReadyReport }

const (
	awsTokenHeader = "X-aws-ec2-metadata-token"
	awsTTLHeader   = "X-aws-ec2-metadata-token-ttl-seconds"
	awsTokenTTL    = "21600" // seconds; the documented maximum, far beyond one boot's fetch
)

func (aws) Name() string { return "aws" }

func (aws) Fetch(ctx context.Context, env Env) (Facts, error) {
	return fromService(ctx, env, "aws", func(ctx context.Context, fe *fetcher) (Facts, error) {
		f := newFacts("aws")
		header := map[string]string{}
		version := "IMDSv2"
		token, err := fe.do(ctx, request{method: http.MethodPut, path: "/latest/api/token", doc: "latest/api/token",
			header: map[string]string{awsTTLHeader: awsTokenTTL}, limit: 4096})
		if err != nil {
			var status statusError
			refused := errors.As(err, &status) || errors.Is(err, errNotFound)
			if !refused || !env.AllowIMDSv1 {
				if refused {
					return Facts{}, fmt.Errorf("%w (IMDSv1 is off: Env.AllowIMDSv1 allows it)", err)
				}
				return Facts{}, err
			}
			version = "IMDSv1"
		} else {
			t := strings.TrimSpace(string(token))
			if t == "" || strings.IndexFunc(t, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
				return Facts{}, docError("aws", "latest/api/token", errors.New("the token is empty or not printable ASCII"))
			}
			header[awsTokenHeader] = t
		}
		f.Source = fmt.Sprintf("aws %s %s", version, fe.base)

		userData, err := fe.get(ctx, "/latest/user-data", "latest/user-data", MaxUserData, header)
		if err != nil && !errors.Is(err, errNotFound) { // 404: the instance has no user data
			return Facts{}, err
		}
		f.setUserData(userData)

		for _, name := range []string{"hostname", "local-hostname"} {
			doc := "latest/meta-data/" + name
			host, err := fe.get(ctx, "/"+doc, doc, 4096, header)
			if errors.Is(err, errNotFound) {
				continue
			}
			if err != nil {
				return Facts{}, err
			}
			f.setHostname(string(host), doc)
			if f.Hostname != "" {
				break
			}
		}

		id, err := fe.get(ctx, "/latest/meta-data/instance-id", "latest/meta-data/instance-id", 4096, header)
		if err != nil {
			return Facts{}, err
		}
		f.setInstanceID(string(id), "latest/meta-data/instance-id")
		return f.Facts, nil
	})
}

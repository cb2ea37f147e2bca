package platform

import (
	"context"
	"errors"
	"net/http"
)

// gcp reads Compute Engine's metadata server. Requests carry "Metadata-Flavor: Google" and
// every answer must carry it back: without it the answer is not from the metadata server
// (a proxy, or something else listening on the address) and is refused. The server is
// metadata.google.internal, which is 169.254.169.254; the address is used since no resolver
// is configured yet at boot.
type gcp struct{ noReadyReport }

func (gcp) Name() string { return "gcp" }

func (gcp) Fetch(ctx context.Context, env Env) (Facts, error) {
	return fromService(ctx, env, "gcp", func(ctx context.Context, fe *fetcher) (Facts, error) {
		fe.check = func(resp *http.Response) error {
			if resp.Header.Get("Metadata-Flavor") != "Google" {
				return errors.New("the answer has no \"Metadata-Flavor: Google\" header: not the metadata server")
			}
			return nil
		}
		header := map[string]string{"Metadata-Flavor": "Google"}
		f := newFacts("gcp")
		f.Source = "gcp metadata server " + fe.base

		const prefix = "/computeMetadata/v1/"
		userData, err := fe.get(ctx, prefix+"instance/attributes/user-data", "instance/attributes/user-data", MaxUserData, header)
		if err != nil && !errors.Is(err, errNotFound) { // 404: no user-data attribute
			return Facts{}, err
		}
		f.setUserData(userData)

		host, err := fe.get(ctx, prefix+"instance/hostname", "instance/hostname", 4096, header)
		if err != nil && !errors.Is(err, errNotFound) {
			return Facts{}, err
		}
		f.setHostname(string(host), "instance/hostname")

		id, err := fe.get(ctx, prefix+"instance/id", "instance/id", 4096, header)
		if err != nil {
			return Facts{}, err
		}
		f.setInstanceID(string(id), "instance/id")
		return f.Facts, nil
	})
}

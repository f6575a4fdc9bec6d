package nodekinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/machine/logbundle"
)

type logsBody struct {
	URL   string `json:"url"`   // presigned https URL the bundle is PUT to
	Since string `json:"since"` // Go duration of logs to include (default 24h)
}

// LogsCollect is the logs.collect kind: a bundle of this node's logs and
// state, redacted of tokens, JWTs, private keys and URL passwords, PUT to a
// presigned https URL. client is nil for the default (system roots).
func LogsCollect(configPath, dataDir string, client *http.Client) dispatch.Kind {
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute}
	}
	return dispatch.Kind{
		Name: "logs.collect", Lane: dispatch.LaneBulk, Resources: fixed("logs"),
		Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
			var body logsBody
			if err := dispatch.DecodeBody(b, &body); err != nil {
				return nil, err
			}
			u, err := url.Parse(body.URL)
			if err != nil || u.Scheme != "https" || u.Host == "" {
				return nil, errors.New(`body: "url" must be a presigned https URL`)
			}
			since := 24 * time.Hour
			if body.Since != "" {
				if since, err = time.ParseDuration(body.Since); err != nil || since <= 0 {
					return nil, errors.New(`body: "since" must be a positive Go duration`)
				}
			}
			res, err := logbundle.Collect(ctx, logbundle.Options{
				URL: body.URL, Client: client, Sources: logbundle.StandardSources(configPath, dataDir, since),
			})
			out, _ := json.Marshal(res)
			if err != nil {
				return out, fmt.Errorf("logs bundle: %w", err)
			}
			return out, nil
		},
	}
}

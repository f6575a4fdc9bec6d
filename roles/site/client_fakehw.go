//go:build fakehw

package main

import (
	"net/http"

	"github.com/better-compute/bcd/components/machine/fakehw/fakehttp"
)

// downloadClient also trusts $BCD_FAKEHW_EXTRA_CA (tests' image sources).
func downloadClient() *http.Client { return fakehttp.Client() }

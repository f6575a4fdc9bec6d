package doctor

import (
	"context"
	"fmt"

	"github.com/better-compute/bcd/components/trust/bundle"
)

// SignedIntent checks the trust bundle held in dataDir: fail when it does
// not verify against pin, warn when it names no command-signing roots (a
// gateway, or whoever holds its serving key, could then order any
// command), ok when signed intent is enforced.
func SignedIntent(dataDir, pin string) Check {
	return Check{Name: "intent", Run: func(context.Context) Result {
		r := Result{Name: "intent"}
		h, err := bundle.Load(dataDir, pin)
		switch {
		case err != nil:
			r.Status, r.Detail = Fail, err.Error()
		case !h.Enforced():
			r.Status = Warn
			r.Detail = fmt.Sprintf("signed intent is off: trust bundle version %d names no command-signing roots, so any command or spec the gateway sends is run (bcgw trust add-root, or a bcgw with its own command key)", h.Version())
		default:
			r.Status = OK
			r.Detail = fmt.Sprintf("signed intent enforced: trust bundle version %d, %d command-signing roots", h.Version(), h.Roots().Len())
		}
		return r
	}}
}

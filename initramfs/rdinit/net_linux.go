package rdinit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

// DHCP brings up every interface but lo and configures the first IPv4
// lease each gets, within timeout; it returns one line per outcome.
func DHCP(timeout time.Duration) []string {
	links, err := netlink.LinkList()
	if err != nil {
		return []string{fmt.Sprintf("netlink: %v", err)}
	}
	var ifs []netlink.Link
	for _, l := range links {
		if l.Attrs().Name != "lo" && !strings.HasPrefix(l.Attrs().Name, "sit") {
			ifs = append(ifs, l)
		}
	}
	if len(ifs) == 0 {
		return []string{"no network interface to configure"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []string
	done := map[string]bool{}
	for r := range dhclient.SendRequests(ctx, ifs, true, false, dhclient.Config{Timeout: 5 * time.Second, Retries: 3}, 10*time.Second) {
		name := r.Interface.Attrs().Name
		if r.Err != nil {
			out = append(out, fmt.Sprintf("%s: DHCP: %v", name, r.Err))
			continue
		}
		if done[name] {
			continue
		}
		if err := r.Lease.Configure(); err != nil {
			out = append(out, fmt.Sprintf("%s: configure lease: %v", name, err))
			continue
		}
		done[name] = true
		out = append(out, fmt.Sprintf("%s: %s", name, r.Lease))
	}
	return out
}

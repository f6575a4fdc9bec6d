// Package bcx is bcd's driver plugin host and the plugin side for Go
// plugins (Serve).
//
// The host runs the plugins of [plugins] dir that its pins file names, each
// only when the SHA-256 of its binary is its pin, and each from the bytes
// it hashed (a sealed memfd), through bcd's own re-exec shim (__bcx-exec):
// its own process group, no_new_privs, a seccomp deny-list and, when bcd is
// root, its own uid and gid from a block. The plugin answers a go-plugin
// style handshake line on stdout naming its unix socket and certificate,
// and serves the bcx.v1.Driver service (Describe, Invoke, Health) there over
// HTTP/2 with mutual TLS, each side pinned to the other's certificate. A
// plugin that exits, or fails to start, is started again after a back-off
// of 1 s doubling to 1 min, hashed and sandboxed anew; meanwhile Invoke
// fails with a retryable "unavailable".
//
// The bcx domain is the general driver-plugin host: the site hosts BMC
// plugins today, and node and ramdisk will host plugins for
// driver.invoke. It and ipmisim (a test BMC, ipmi_sim) import only base.
package bcx

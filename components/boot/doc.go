// Package boot groups the site's boot server: bootserver (boot entries,
// iPXE scripts and images over HTTP), proxydhcp, tftpd, ipxe (script
// rendering), imagecache (the verified, content-addressed cache),
// bootparams (the bc.* kernel parameters the site writes and the ramdisk
// reads), bootlease (the site's boot lease), sitespec (the site section
// of the NodeSpec: the lease and cache_images) and sitekinds (the site's
// boot.* command kinds).
//
// It may import base, trust and agent. The node role must not link the
// boot server, the cache or the site kinds (roles/deps_test.go).
package boot

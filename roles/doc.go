// Package roles holds one folder per role binary (node, site, ramdisk,
// helper) with its main and checked-in dependency list; its tests check
// every role's links and that every package is documented.
package roles

package main

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	// gitDescribe is `git describe --tags` past a tag: 1.2.3-4-gabcdef0,
	// with -dirty when the tree had changes.
	gitDescribe = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]{4,40})(-dirty)?$`)
	// pkgVersionRE is what both dpkg and rpm accept and order the same way:
	// a leading digit, then letters, digits, '.', '+' and '~'.
	pkgVersionRE = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)
)

// packageVersion turns the build's version (the VERSION the binaries were
// built with: a tag such as v1.2.3, `git describe` output, or the
// Makefile's 0.1.0-dev) into the version both package formats carry:
//
//	v1.2.3            -> 1.2.3
//	1.2.3-4-gabcdef0  -> 1.2.3+git4.gabcdef0   (after 1.2.3, before 1.2.4)
//	0.1.0-dev         -> 0.1.0~dev             (before 0.1.0)
//	1.2.3-rc.1-dirty  -> 1.2.3~rc.1~dirty
//
// A '-' would be dpkg's revision separator and is not allowed in an rpm
// version, so a pre-release's '-' becomes '~', which both sort before the
// release. Anything else that is not a version is an error.
func packageVersion(raw string) (string, error) {
	v := strings.TrimPrefix(strings.TrimSpace(raw), "v")
	if m := gitDescribe.FindStringSubmatch(v); m != nil {
		v = m[1] + "+git" + m[2] + ".g" + m[3]
		if m[4] != "" {
			v += ".dirty"
		}
	}
	v = strings.ReplaceAll(v, "-", "~")
	if !pkgVersionRE.MatchString(v) {
		return "", fmt.Errorf("version %q: a package version starts with a digit and holds only letters, digits, '.', '+', '~' and '-'", raw)
	}
	return v, nil
}

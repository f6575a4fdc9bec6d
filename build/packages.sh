#!/usr/bin/env bash
# make packages: cross-compiles bcd-node, bcd-site, bcd-helper and bcgw for
# each architecture into bin/ARCH/ and builds bcd-node, bcd-site, bcgw and
# (when images/out holds a ramdisk) bcd-ramdisk-image-ARCH as .deb and .rpm into
# bin/packages/ with build/pkg (nfpm, in its own Go module). It ends with
# each package's size next to its binaries'. See docs/packages.md.
#
# Environment:
#   VERSION      the version (default: git describe --tags of a v* tag, else
#                0.0.0~gitYYYYMMDDhhmmss.COMMIT from the last commit)
#   RELEASE_SEQUENCE  the release's sequence, as in its signed manifest
#                (bcrelease make --sequence); stamped into the binaries, it
#                is the release floor a node installed from these packages
#                starts at (default 0: no floor until the first update)
#   ARCHES       architectures (default "amd64 arm64")
#   BIN_DIR      where ARCH/bcd-* are built (default bin)
#   PKG_DIR      where the packages go (default bin/packages)
#   IMAGES_DIR   the ramdisk artifacts (default images/out)
#   FORMATS      package formats (default "deb rpm")
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

arches=${ARCHES:-amd64 arm64}
bin_dir=$(realpath -m "${BIN_DIR:-$root/bin}")
pkg_dir=$(realpath -m "${PKG_DIR:-$root/bin/packages}")
images_dir=$(realpath -m "${IMAGES_DIR:-$root/images/out}")
formats=${FORMATS:-deb rpm}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
version=${VERSION:-}
if [ -z "$version" ]; then
  if ! version=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
    when=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S 2>/dev/null || date -u +%Y%m%d%H%M%S)
    version="0.0.0~git$when.$commit"
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
      version+=".dirty"
    fi
  fi
fi
# Reproducible packages: every file carries the last commit's time.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

sequence=${RELEASE_SEQUENCE:-0}
case $sequence in
  ''|*[!0-9]*) echo "packages: RELEASE_SEQUENCE=$sequence is not a number" >&2; exit 2 ;;
esac
ldflags="-s -w -X github.com/better-compute/bcd/components/base/buildinfo.Version=$version -X github.com/better-compute/bcd/components/base/buildinfo.Commit=$commit -X github.com/better-compute/bcd/components/base/buildinfo.Sequence=$sequence"
for arch in $arches; do
  mkdir -p "$bin_dir/$arch"
  for role in node site helper; do
    gcflags=""; [ "$role" = helper ] && gcflags="all=-l" # smaller; see HELPER_GOFLAGS in the Makefile
    CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -gcflags "$gcflags" -ldflags "$ldflags" \
      -o "$bin_dir/$arch/bcd-$role" "./roles/$role"
  done
  CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$arch/bcgw" ./cmd/bcgw
done
echo "packages: version $version (commit $commit, release sequence $sequence) into $pkg_dir" >&2

cd build/pkg
exec go run . --version "$version" --commit "$commit" \
  --arch "${arches// /,}" --formats "${formats// /,}" \
  --bin "$bin_dir" --out "$pkg_dir" --images "$images_dir"

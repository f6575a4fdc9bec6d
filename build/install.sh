#!/usr/bin/env bash
# install.sh: installs bcd on this host. It installs the bcd-node (or
# bcd-site) package built for this host's architecture and package format
# from a local path or an https URL, writes /etc/bcd/config.toml from its
# flags, optionally joins with a token read from a file or standard input
# (never from an argument), and enables and starts the units. With
# --unprivileged it runs bcd node as the bcd account beside bcd helper.
# Run it again to upgrade; it keeps an existing config.toml. See
# docs/packages.md, or install.sh --help.
set -euo pipefail
umask 022

prog=install.sh
usage() {
  cat <<'EOF'
usage: install.sh [flags]

What to install (without either, the package must already be installed):
  --package PATH|URL       the package file itself (an https:// URL, or a local path)
  --from DIR|URL           a directory or https:// base URL holding the packages;
                           picks the one for this host's format and architecture
  --version V              the package version to pick with --from (e.g. 1.2.3)
  --sha256 HEX             the package's SHA-256, checked before installing
  --role node|site         bcd-node (default) or bcd-site; a machine is one or the other
  --format deb|rpm         override the package format detected (dpkg or rpm)

config.toml (written when missing, or with --overwrite-config; kept otherwise):
  --gateway URL            the gateway, https://host[:port]
  --server-name NAME       the TLS server name when --gateway names an IP address
  --serving-ca-pin PIN     sha256/... of the gateway's serving CA
  --join-signing-pin PIN   sha256/... of the JoinService signing key
  --join-encryption-pin PIN  sha256/... of the JoinService encryption key
  --site NAME              the site this machine belongs to
  --data-dir DIR           the data directory (default /var/lib/bcd)
  --overwrite-config       replace an existing config.toml
  --join-encryption-jwk FILE  the join key, copied next to config.toml
  --server URL             the control plane, for its well-known join key when
                           there is no join-encryption.jwk

Joining (the token is never an argument):
  --token-file FILE        read the join token from FILE
  --token-stdin            read the join token from the first line of standard input

Privileges:
  --unprivileged           run bcd node as the bcd account (created, nologin, no home,
                           in neither the libvirt nor the tss group) beside
                           bcd-helper.service; config.toml becomes root:bcd 0640
  --plugins                set the node up for bcx plugins (refused with --unprivileged)

  --no-start               enable the units but start nothing
  -h, --help               this text
EOF
}

die() { echo "$prog: $*" >&2; exit 1; }
usage_error() { echo "$prog: $*" >&2; echo "$prog: see install.sh --help" >&2; exit 2; }

role=node package="" from="" pkg_version="" sha256="" format=""
gateway="" server_name="" serving_ca_pin="" join_signing_pin="" join_encryption_pin=""
site="" data_dir=/var/lib/bcd data_dir_given=0 overwrite_config=0 jwk="" server=""
token_file="" token_stdin=0 unprivileged=0 plugins=0 no_start=0

# --flag=value is --flag value.
args=()
for a in "$@"; do
  case $a in
    --*=*) args+=("${a%%=*}" "${a#*=}") ;;
    *) args+=("$a") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"

while [ $# -gt 0 ]; do
  flag=$1
  shift
  case $flag in
    -h | --help) usage; exit 0 ;;
    --unprivileged) unprivileged=1; continue ;;
    --plugins) plugins=1; continue ;;
    --no-start) no_start=1; continue ;;
    --overwrite-config) overwrite_config=1; continue ;;
    --token-stdin) token_stdin=1; continue ;;
    --package | --from | --version | --sha256 | --role | --format | --gateway | --server-name | \
      --serving-ca-pin | --join-signing-pin | --join-encryption-pin | --site | --data-dir | \
      --join-encryption-jwk | --server | --token-file)
      [ $# -gt 0 ] || usage_error "$flag needs a value"
      value=$1
      shift
      ;;
    --*)
      # Echo a flag only when it looks like one: never a pasted secret.
      if [[ $flag =~ ^--[a-z][a-z-]{0,31}$ ]]; then
        usage_error "unknown flag $flag"
      fi
      usage_error "unknown flag"
      ;;
    *) usage_error "takes no positional arguments (a join token goes in --token-file or on standard input with --token-stdin, never in arguments)" ;;
  esac
  case $flag in
    --package) package=$value ;;
    --from) from=${value%/} ;;
    --version) pkg_version=$value ;;
    --sha256) sha256=$value ;;
    --role) role=$value ;;
    --format) format=$value ;;
    --gateway) gateway=$value ;;
    --server-name) server_name=$value ;;
    --serving-ca-pin) serving_ca_pin=$value ;;
    --join-signing-pin) join_signing_pin=$value ;;
    --join-encryption-pin) join_encryption_pin=$value ;;
    --site) site=$value ;;
    --data-dir) data_dir=$value; data_dir_given=1 ;;
    --join-encryption-jwk) jwk=$value ;;
    --server) server=$value ;;
    --token-file) token_file=$value ;;
  esac
done

# --- the flags, checked before anything changes -----------------------------

if [ "$unprivileged" = 1 ] && [ "$plugins" = 1 ]; then
  usage_error "--unprivileged refuses --plugins: bcx plugins run under their own uids, which only a root bcd node can give them"
fi
if [ "$plugins" = 1 ]; then
  usage_error "--plugins: this build has no bcx plugin host yet"
fi
case $role in node | site) ;; *) usage_error "--role must be node or site" ;; esac
if [ "$role" = site ] && [ "$unprivileged" = 1 ]; then
  usage_error "--unprivileged is for nodes: bcd site runs as root and ignores [helper]"
fi
case $format in "" | deb | rpm) ;; *) usage_error "--format must be deb or rpm" ;; esac
if [ -n "$package" ] && [ -n "$from" ]; then
  usage_error "give --package or --from, not both"
fi
if [ -n "$from" ] && [ -z "$pkg_version" ]; then
  usage_error "--from needs --version (the package version to pick)"
fi
if [ -n "$pkg_version" ] && ! [[ $pkg_version =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
  usage_error "--version: a package version such as 1.2.3 or 0.1.0~dev"
fi
for src in "$package" "$from" "$server"; do
  case $src in
    http://*) usage_error "plain http:// is refused: use https://" ;;
    *://*) [[ $src == https://* ]] || usage_error "only https:// URLs" ;;
  esac
done
if [ -n "$sha256" ] && ! [[ $sha256 =~ ^[0-9a-fA-F]{64}$ ]]; then
  usage_error "--sha256: 64 hex digits"
fi
gateway_re='^https://[][A-Za-z0-9.:-]+(/[A-Za-z0-9._~/-]*)?$'
if [ -n "$gateway" ] && ! [[ $gateway =~ $gateway_re ]]; then
  usage_error "--gateway: an https://host[:port] URL"
fi
if [ -n "$server_name" ] && ! [[ $server_name =~ ^[A-Za-z0-9.-]{1,253}$ ]]; then
  usage_error "--server-name: a DNS name"
fi
for pin in "$serving_ca_pin" "$join_signing_pin" "$join_encryption_pin"; do
  if [ -n "$pin" ] && ! [[ $pin =~ ^sha256/[A-Za-z0-9+/]{43}=$ ]]; then
    usage_error "a pin is sha256/ and 44 characters of base64"
  fi
done
if [ -n "$site" ] && ! [[ $site =~ ^[A-Za-z0-9._-]{1,63}$ ]]; then
  usage_error "--site: letters, digits, '.', '_' and '-'"
fi
if ! [[ $data_dir =~ ^(/[A-Za-z0-9._-]+)+$ ]] || [[ $data_dir =~ /\.\.?(/|$) ]]; then
  usage_error "--data-dir: an absolute, clean path"
fi
if [ -n "$token_file" ] && [ "$token_stdin" = 1 ]; then
  usage_error "give --token-file or --token-stdin, not both"
fi
if [ -n "$token_file" ] && [ ! -f "$token_file" ]; then
  usage_error "--token-file: $token_file is not a regular file"
fi
if [ -n "$jwk" ] && [ ! -f "$jwk" ]; then
  usage_error "--join-encryption-jwk: $jwk is not a regular file"
fi

[ "$(id -u)" = 0 ] || die "runs as root"

conf_dir=/etc/bcd
conf=$conf_dir/config.toml
token_dst=$conf_dir/join-token
dropin_dir=/etc/systemd/system/bcd.service.d
unpriv_dropin=$dropin_dir/10-unprivileged.conf
if [ "$role" = node ] && [ -e "$unpriv_dropin" ] && [ "$unprivileged" = 0 ]; then
  die "bcd node runs unprivileged on this host ($unpriv_dropin): pass --unprivileged, or remove that drop-in and config.toml's [helper] section first to run it as root"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the package -------------------------------------------------------------

if [ -z "$format" ]; then
  if command -v dpkg >/dev/null 2>&1 && [ -d /var/lib/dpkg ] && dpkg --print-architecture >/dev/null 2>&1; then
    format=deb
  elif command -v rpm >/dev/null 2>&1; then
    format=rpm
  else
    die "neither dpkg nor rpm here: no package format to install"
  fi
fi
if [ "$format" = deb ]; then
  arch=$(dpkg --print-architecture)
  case $arch in amd64 | arm64) ;; *) die "no bcd package for architecture $arch" ;; esac
else
  arch=$(uname -m)
  case $arch in x86_64 | aarch64) ;; *) die "no bcd package for architecture $arch" ;; esac
fi
name=bcd-$role
other=bcd-node
[ "$role" = node ] && other=bcd-site

installed() {
  if [ "$format" = deb ]; then
    [ "$(dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null || true)" = installed ]
  else
    rpm -q "$1" >/dev/null 2>&1
  fi
}

fetch() { # URL DEST
  if command -v curl >/dev/null 2>&1; then
    curl --proto '=https' --tlsv1.2 -fsSL -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget --https-only -q -O "$2" "$1"
  else
    die "neither curl nor wget here to download $1"
  fi
}

if [ -n "$from" ]; then
  if [ "$format" = deb ]; then
    package=$from/${name}_${pkg_version}_$arch.deb
  else
    package=$from/$name-$pkg_version-1.$arch.rpm
  fi
fi
if [ -n "$package" ]; then
  if installed "$other"; then
    die "$other is installed: a machine is a node or a site; remove $other first"
  fi
  case $package in
    https://*)
      file=$work/${package##*/}
      echo "$prog: downloading $package" >&2
      fetch "$package" "$file" || die "could not download $package"
      ;;
    *)
      [ -f "$package" ] || die "$package: no such file"
      file=$package
      ;;
  esac
  if [ -n "$sha256" ]; then
    got=$(sha256sum "$file" | cut -d' ' -f1)
    [ "$got" = "${sha256,,}" ] || die "$package: SHA-256 $got, expected ${sha256,,}"
  fi
  if [ "$format" = deb ]; then
    pkg_name=$(dpkg-deb -f "$file" Package) || die "$package is not a .deb"
    pkg_arch=$(dpkg-deb -f "$file" Architecture)
  else
    pkg_name=$(rpm -qp --qf '%{NAME}' "$file" 2>/dev/null) || die "$package is not an .rpm"
    pkg_arch=$(rpm -qp --qf '%{ARCH}' "$file" 2>/dev/null)
  fi
  [ "$pkg_name" = "$name" ] || die "$package holds $pkg_name, not $name (--role $role)"
  [ "$pkg_arch" = "$arch" ] || die "$package is for $pkg_arch; this host is $arch"
  echo "$prog: installing $package" >&2
  if [ "$format" = deb ]; then
    dpkg -i "$file" >&2
  else
    rpm -U --replacepkgs "$file" >&2
  fi
elif ! installed "$name"; then
  die "$name is not installed: give --package or --from"
fi
[ -x /usr/bin/bcd ] || die "/usr/bin/bcd is missing after installing $name"

# --- the account, the directories, config.toml ---------------------------------

owner=root:root
if [ "$unprivileged" = 1 ]; then
  # Creates the account when missing, and takes it out of the libvirt and
  # tss groups: the helper, not the node, talks to libvirt and the TPM.
  /usr/libexec/bcd/bcd-account
  owner=root:bcd
fi

install -d -m 0755 -o root -g root "$conf_dir"

write_config() {
  for need in gateway serving_ca_pin join_signing_pin join_encryption_pin; do
    [ -n "${!need}" ] || usage_error "writing $conf needs --${need//_/-}"
  done
  local tmp
  tmp=$(mktemp "$conf_dir/.config.toml.XXXXXX")
  {
    echo "# Written by install.sh; see docs/configuration.md. Edits are kept on upgrade."
    echo "gateway = \"$gateway\""
    [ -z "$server_name" ] || echo "gateway_server_name = \"$server_name\""
    echo "serving_ca_spki_pin = \"$serving_ca_pin\""
    echo "join_signing_key_pin = \"$join_signing_pin\""
    echo "join_encryption_key_pin = \"$join_encryption_pin\""
    echo "data_dir = \"$data_dir\""
    if [ -n "$site" ]; then
      echo
      echo "[site]"
      echo "name = \"$site\""
    fi
    if [ "$unprivileged" = 1 ]; then
      echo
      echo "[helper]"
      echo "socket = \"/run/bcd-helper/helper.sock\""
      echo "user = \"bcd\""
      echo "entrypoint = \"/usr/bin/bcd\""
    fi
  } >"$tmp"
  chown "$owner" "$tmp"
  chmod "$config_mode" "$tmp"
  sync "$tmp"
  mv -f "$tmp" "$conf"
}

config_mode=0600
[ "$unprivileged" = 1 ] && config_mode=0640
if [ ! -e "$conf" ] || [ "$overwrite_config" = 1 ]; then
  write_config
  echo "$prog: wrote $conf ($owner $config_mode)" >&2
else
  if [ "$unprivileged" = 1 ] && ! grep -q '^\[helper\]' "$conf"; then
    die "$conf has no [helper] section: add it, or rerun with --overwrite-config and the config flags"
  fi
  if [ "$data_dir_given" = 0 ]; then
    # The data directory the kept file names.
    kept=$(sed -n 's/^data_dir *= *"\(.*\)"$/\1/p' "$conf" | head -n 1)
    [ -z "$kept" ] || data_dir=$kept
  fi
  chown "$owner" "$conf"
  chmod "$config_mode" "$conf"
  echo "$prog: kept $conf ($owner $config_mode)" >&2
fi

if [ -n "$jwk" ]; then
  install -m 0644 -o root -g root "$jwk" "$conf_dir/join-encryption.jwk"
fi

if [ ! -d "$data_dir" ]; then
  install -d -m 0700 -o root -g root "$data_dir"
fi
if [ "$unprivileged" = 1 ]; then
  chown -R bcd:bcd "$data_dir"
  chmod 0700 "$data_dir"
fi

# A data directory other than /var/lib/bcd must be writable to the units.
if [ "$role" = node ]; then units="bcd.service bcd-join.service"; else units="bcd-site.service"; fi
for unit in $units; do
  d=/etc/systemd/system/$unit.d/20-data-dir.conf
  if [ "$data_dir" = /var/lib/bcd ]; then
    rm -f "$d"
  else
    install -d -m 0755 "${d%/*}"
    printf '# Written by install.sh: the data directory config.toml names.\n[Service]\nReadWritePaths=%s\n' "$data_dir" >"$d"
  fi
done

if [ "$unprivileged" = 1 ]; then
  install -d -m 0755 "$dropin_dir"
  install -m 0644 /usr/share/bcd/bcd.service.d/10-unprivileged.conf "$unpriv_dropin"
fi

# --- the token and the join ----------------------------------------------------

if [ "$token_stdin" = 1 ]; then
  token=""
  IFS= read -r token || [ -n "$token" ] || true
  token=${token%$'\r'}
  [ -n "$token" ] || usage_error "--token-stdin: no token on standard input"
  tmp=$(umask 077 && mktemp "$conf_dir/.join-token.XXXXXX")
  printf '%s\n' "$token" >"$tmp"
  token=""
  mv -f "$tmp" "$token_dst"
elif [ -n "$token_file" ]; then
  install -m 0600 -o root -g root "$token_file" "$token_dst"
fi

joined=0
[ -e "$data_dir/identity.json" ] && joined=1
if [ -e "$token_dst" ] || { [ -n "$server" ] && [ "$joined" = 0 ]; }; then
  join=(/usr/bin/bcd join --config "$conf" --role "$role")
  [ -e "$token_dst" ] && join+=(--token-file "$token_dst")
  [ -z "$server" ] || join+=(--server "$server")
  if "${join[@]}"; then
    joined=1
    # The node, running as bcd, owns what the join wrote.
    [ "$unprivileged" = 0 ] || chown -R bcd:bcd "$data_dir"
  elif [ "$role" = node ]; then
    die "bcd join failed; the token stays in $token_dst and bcd-join.service tries again at every boot"
  else
    die "bcd join failed; the token stays in $token_dst: run install.sh again"
  fi
fi

# --- the units ---------------------------------------------------------------

if [ "$role" = node ]; then enable="bcd-join.service bcd.service"; main=bcd.service; else enable=bcd-site.service; main=bcd-site.service; fi
[ "$unprivileged" = 1 ] && enable="bcd-helper.service $enable"
if command -v systemctl >/dev/null 2>&1; then
  # shellcheck disable=SC2086 # unit names, split on purpose
  systemctl enable $enable >&2
else
  echo "$prog: no systemctl here: enable $enable yourself" >&2
fi
if [ ! -d /run/systemd/system ]; then
  echo "$prog: systemd is not running here: $enable start at the next boot" >&2
elif [ "$no_start" = 1 ]; then
  echo "$prog: --no-start: $enable are enabled, not started" >&2
else
  systemctl daemon-reload
  [ "$unprivileged" = 0 ] || systemctl restart bcd-helper.service
  if [ "$joined" = 1 ]; then
    systemctl restart "$main"
    echo "$prog: started $main" >&2
  else
    echo "$prog: not joined yet, so $main is not started: put a token in $token_dst (0600) and run systemctl start bcd-join.service $main" >&2
  fi
fi
echo "$prog: done: $name on $arch, $conf, data in $data_dir$([ "$unprivileged" = 1 ] && echo ", bcd node unprivileged beside bcd-helper")" >&2

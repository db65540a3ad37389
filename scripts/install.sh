#!/usr/bin/env bash
# Install egpu-setup system-wide and root-owned: its own venv under /opt/egpu-setup/tool, made
# from the system's Python, and a link at /usr/local/bin/egpu-setup.
#
#   bash scripts/install.sh            # as root, from a checkout (or an unpacked sdist)
#
# Why not `pip install .`, pipx or `uv tool install`: Debian 12 and Ubuntu 23.04+ refuse pip into
# the system Python (PEP 668, "externally-managed-environment"), and egpu-setup runs as root, so
# it must not live where a user can change it (a venv in a home, ~/.local/pipx): root would run
# that user's code. The venv here is made by root with umask 022 from the distribution's own
# /usr/bin/python3 and the source is copied into it (not an editable install), so later edits to
# the checkout do not change what root runs.
#
# Environment: EGPU_SETUP_TOOL (default /opt/egpu-setup/tool), PYTHON (default /usr/bin/python3).
# pip reads the machine's own configuration (/etc/pip.conf: a lab mirror is used as configured).
# Undo: rm -rf /opt/egpu-setup/tool /usr/local/bin/egpu-setup /usr/local/share/man/man1/egpu-setup.1
#       /usr/local/share/bash-completion/completions/egpu-setup
set -euo pipefail
umask 022

fail() { # usage: fail EXIT_CODE "what failed" "one next step"
  printf 'error: %s\nhint: %s\n' "$2" "$3" >&2
  exit "$1"
}

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tool=${EGPU_SETUP_TOOL:-/opt/egpu-setup/tool}
python=${PYTHON:-/usr/bin/python3}
bindir=/usr/local/bin

[ "$(id -u)" -eq 0 ] || fail 2 "installing egpu-setup system-wide needs root" \
  "run it as root: sudo bash $0 (a dry run needs no root: see README, 'Quick start')"
[ -f "$src/pyproject.toml" ] || fail 2 "$src is not an egpu-setup source tree" \
  "run the script from a checkout: bash path/to/egpu-setup/scripts/install.sh"
case "$tool" in
  /*) ;;
  *) fail 2 "EGPU_SETUP_TOOL must be an absolute path (got '$tool')" "unset it for /opt/egpu-setup/tool" ;;
esac
[ -x "$python" ] || fail 2 "no Python at $python" "install python3 (apt-get install python3) or set PYTHON"

# Root runs this interpreter and everything it imports: it must be root's, not a user's.
real=$(readlink -f "$python")
owner=$(stat -Lc '%u' "$real")
mode=$(stat -Lc '%a' "$real")
if [ "$owner" != 0 ] || (( 8#$mode & 8#022 )); then
  fail 2 "$real is owned by uid $owner with mode $mode: root must not run a Python a user can change" \
    "use the distribution's /usr/bin/python3 (PYTHON=/usr/bin/python3)"
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  fail 2 "egpu-setup needs Python 3.10 or newer; $python is $version" "set PYTHON to a newer python3"

# Debian and Ubuntu ship venv's ensurepip in a separate package (python3-venv).
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  command -v apt-get >/dev/null ||
    fail 2 "$python has no ensurepip (the venv module cannot install pip)" \
      "install your distribution's python3 venv package, then run this again"
  echo "installing python3-venv (Python $version has no ensurepip) ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    python3-venv >&2 ||
    fail 1 "apt-get install python3-venv failed" "run 'apt-get update' and try again"
fi

echo "creating $tool with $python ($version) ..." >&2
mkdir -p "$(dirname "$tool")"
"$python" -m venv --clear "$tool"
# The wheels of egpu-setup and of what it depends on are kept, with their sha256s, in the venv
# (share/egpu-setup/wheels, root's): when egpu-setup later puts itself into a lab image or into
# a bundle, it uses these files and nothing else, never this source tree again and never a
# package fetched by its name (docs/design.md, "Root safety").
wheels="$tool/share/egpu-setup/wheels"
pip=("$tool/bin/python" -m pip --disable-pip-version-check --quiet)
echo "building egpu-setup's wheel from $src ..." >&2
mkdir -p "$wheels"
"${pip[@]}" wheel --no-deps --wheel-dir "$wheels" "$src" >&2 ||
  fail 1 "pip could not build egpu-setup's wheel from $src" \
    "check the network or the index in /etc/pip.conf (the build needs setuptools), then run this again"
ours=("$wheels"/egpu_setup-*.whl)
echo "downloading the wheels egpu-setup depends on ..." >&2
"${pip[@]}" download --only-binary=:all: --dest "$wheels" "${ours[0]}" >&2 ||
  fail 1 "pip could not download egpu-setup's dependencies" \
    "check the network or the index in /etc/pip.conf, then run this again"
# and for the Python of every distribution egpu-setup knows, so it can put itself into an image
# of another release than this machine's (PyYAML and MarkupSafe are built per Python)
sed -n 's/^ *python: "\(3\.[0-9]*\)".*/\1/p' "$src/egpu_setup/data/distros.yaml" | sort -u |
  while read -r py; do
    [ "$py" = "$version" ] && continue
    "${pip[@]}" download --only-binary=:all: --implementation cp --python-version "$py" \
      --dest "$wheels" "${ours[0]}" >&2 ||
      echo "warning: no wheels of egpu-setup's dependencies for Python $py: images with it need a bundle" >&2
  done
(cd "$wheels" && sha256sum -- *.whl >SHA256SUMS)
# pins each kept wheel by version and hash: pip installs those files and no other
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
while read -r sum file; do
  IFS=- read -r name version _ <<<"$file"
  printf '%s==%s --hash=sha256:%s\n' "$name" "$version" "$sum"
done <"$wheels/SHA256SUMS" >"$requirements"
echo "installing egpu-setup from those wheels ..." >&2
"${pip[@]}" install --no-warn-script-location --no-index --find-links "$wheels" \
  --require-hashes -r "$requirements" >&2 ||
  fail 1 "pip could not install egpu-setup into $tool from $wheels" "run this again; if it fails again, report it"

mkdir -p "$bindir"
ln -sfn "$tool/bin/egpu-setup" "$bindir/egpu-setup"
# Tab completion of commands, options and --profile names (bash-completion reads
# $XDG_DATA_DIRS/bash-completion/completions, /usr/local/share included), and the man page.
completions=/usr/local/share/bash-completion/completions
mkdir -p "$completions"
_EGPU_SETUP_COMPLETE=bash_source "$tool/bin/egpu-setup" >"$completions/egpu-setup"
man=$(find "$tool/share/man/man1" -name egpu-setup.1 2>/dev/null | head -n 1)
if [ -n "$man" ]; then
  mkdir -p /usr/local/share/man/man1
  ln -sfn "$man" /usr/local/share/man/man1/egpu-setup.1
fi
echo "installed: $bindir/egpu-setup -> $tool/bin/egpu-setup ($("$bindir/egpu-setup" --version))" >&2

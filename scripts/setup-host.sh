#!/usr/bin/env bash
# Installs the host packages rollbox needs on Debian 12 (bookworm), as root.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail

need_apt_update=1
apt_install() {
    if [ "$need_apt_update" = 1 ]; then apt-get update -qq; need_apt_update=0; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# gVisor from bookworm-backports: the 20240729 build has the systrap platform and a
# working checkpoint/restore here (systrap, --network=sandbox); bookworm's own 20221219 is too old.
if ! runsc --version 2>/dev/null | grep -q '20240729'; then
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        cat >/etc/apt/sources.list.d/rollbox-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    apt_install -t bookworm-backports runsc
fi

missing=()
for pair in runc:runc debootstrap:debootstrap iproute2:ip util-linux:nsenter nftables:nft docker-registry:docker-registry skopeo:skopeo apache2-utils:htpasswd zstd:zstd e2fsprogs:mkfs.ext4 mount:losetup; do
    pkg=${pair%%:*}; bin=${pair##*:}
    command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then apt_install "${missing[@]}"; fi

# The native agent (rollbox/runtime/agent/native) builds with Debian's own cargo and rustc
# (1.63) from Debian's packaged crates, which land in /usr/share/cargo/registry (the directory
# source its .cargo/config.toml names): no rustup, no crates.io.
agent_pkgs=(cargo rustc librust-serde-json-dev librust-sha2-dev librust-hmac-dev librust-base64-dev
            librust-libc-dev librust-once-cell-dev)
agent_missing=()
for pkg in "${agent_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || agent_missing+=("$pkg")
done
if [ ${#agent_missing[@]} -gt 0 ]; then apt_install "${agent_missing[@]}"; fi
echo "host set-up: ok ($(runsc --version | head -1))"

#!/usr/bin/env bash
# Installs the binaries the suite's real-part tests run (Debian/Ubuntu): redis-server and PostgreSQL for
# scale-out, headless Chromium for the /docs page, nginx for the deployment kit's proxy site and
# promtool (Debian's prometheus package) for its alert rules, and node with npm for the npm standardwebhooks
# library's check of our signatures. Idempotent and quiet: does nothing when all are present. Starts no
# service: the tests start throwaway servers of their own on loopback (tests/servers.py) and skip when
# these are missing, except node and npm, which tests/test_standard_webhooks.py requires.
set -euo pipefail

have_redis() { command -v redis-server >/dev/null 2>&1; }
have_chromium() { command -v chromium >/dev/null 2>&1; }
have_nginx() { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }
have_promtool() { command -v promtool >/dev/null 2>&1; }
have_node() { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; }
have_postgres() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null; }

packages=()
have_redis || packages+=(redis-server)
have_postgres || packages+=(postgresql)
# A font, so the page renders real glyphs in the screenshot.
have_chromium || packages+=(chromium fonts-dejavu-core)
have_nginx || packages+=(nginx)
have_promtool || packages+=(prometheus)
have_node || packages+=(nodejs npm)
[ ${#packages[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "test-services: apt-get not found; install ${packages[*]} by hand (the tests that need them skip)" >&2
    exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "test-services: need root (or sudo) to install ${packages[*]}" >&2; exit 1; }
    sudo=(sudo -n)
fi

# Keep the packages' maintainer scripts from starting long-lived system services.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi

export DEBIAN_FRONTEND=noninteractive
apt_get=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0)
log=$(mktemp)
if ! { "${apt_get[@]}" update && "${apt_get[@]}" install --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "test-services: installing ${packages[*]} failed" >&2
    exit 1
fi
rm -f "$log"
have_redis && have_postgres && have_chromium && have_nginx && have_promtool && have_node || { echo "test-services: ${packages[*]} installed but binaries not found" >&2; exit 1; }
echo "test-services: installed ${packages[*]}"

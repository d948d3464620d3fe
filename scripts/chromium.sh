#!/usr/bin/env bash
# Install Chromium for the console's browser tests (console/browser_test.go)
# if it is missing. Idempotent: does nothing when /usr/bin/chromium (or
# $BENTO_CHROMIUM) is there. Needs root or password-less sudo for apt-get;
# without them it says how to install and, unless CI is set, carries on (the
# browser tests then skip).
set -euo pipefail

tool=chromium
# shellcheck source=scripts/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

if [[ -n "${BENTO_CHROMIUM:-}" && -x "${BENTO_CHROMIUM}" ]]; then
	log "using ${BENTO_CHROMIUM}"
	exit 0
fi
if [[ -x /usr/bin/chromium ]]; then
	log "installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
	exit 0
fi

apt_privileges /usr/bin/chromium chromium
log "installing chromium with apt-get"
apt_install chromium
log "installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"

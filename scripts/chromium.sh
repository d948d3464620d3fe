#!/usr/bin/env bash
# Install Chromium for the console's browser tests (console/browser_test.go)
# if it is missing. Idempotent: does nothing when /usr/bin/chromium (or
# $BENTO_CHROMIUM) is there. Needs root or password-less sudo for apt-get;
# without them it says how to install and, unless CI is set, carries on (the
# browser tests then skip).
set -euo pipefail

log() { echo "chromium: $*" >&2; }

if [[ -n "${BENTO_CHROMIUM:-}" && -x "${BENTO_CHROMIUM}" ]]; then
	log "using ${BENTO_CHROMIUM}"
	exit 0
fi
if [[ -x /usr/bin/chromium ]]; then
	log "installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
	exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
	sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
	sudo=(sudo -n)
else
	log "/usr/bin/chromium is missing and apt-get needs root: run 'apt-get install -y chromium' as root"
	[[ -z "${CI:-}" ]] || exit 1
	exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log "installing chromium with apt-get"
if ! "${sudo[@]}" apt-get install -y --no-install-recommends chromium; then
	# The package lists may be missing or stale on a fresh machine.
	"${sudo[@]}" apt-get update
	"${sudo[@]}" apt-get install -y --no-install-recommends chromium
fi
log "installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"

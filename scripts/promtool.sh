#!/usr/bin/env bash
# Install promtool for the test that checks the Prometheus alerting rules in
# deploy/prometheus (deploy/deploy_test.go) if it is missing. Idempotent:
# does nothing when promtool is on PATH (or $BENTO_PROMTOOL is set). It
# comes with Debian's prometheus package, installed without starting the
# server. Needs root or password-less sudo for apt-get; without them it
# says how to install and, unless CI is set, carries on (that check then
# skips).
set -euo pipefail

tool=promtool
# shellcheck source=scripts/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

if [[ -n "${BENTO_PROMTOOL:-}" && -x "${BENTO_PROMTOOL}" ]]; then
	log "using ${BENTO_PROMTOOL}"
	exit 0
fi
if command -v promtool >/dev/null; then
	log "installed: $(promtool --version 2>&1 | head -1)"
	exit 0
fi

apt_privileges promtool prometheus

# The package would start its server where an init system runs; keep it
# from doing so: only promtool is wanted.
policy=/usr/sbin/policy-rc.d
created_policy=""
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
	"${sudo[@]}" chmod +x "$policy"
	created_policy=1
fi
log "installing prometheus (for promtool) with apt-get"
apt_install prometheus
[[ -z $created_policy ]] || "${sudo[@]}" rm -f "$policy"
log "installed: $(promtool --version 2>&1 | head -1)"

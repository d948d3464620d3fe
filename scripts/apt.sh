# shellcheck shell=bash
# Shared by scripts/chromium.sh and scripts/promtool.sh, which source it
# after setting `tool` (the name their messages start with): how to install
# a Debian package as root or with password-less sudo.

log() { echo "${tool}: $*" >&2; }

# apt_privileges MISSING PACKAGE sets the array `sudo` to what runs apt-get
# with root rights: nothing as root, `sudo -n` with password-less sudo.
# Without either it says that MISSING is missing and how to install PACKAGE
# as root, then ends the script: with failure when CI is set, else with
# success (the tests that need it then skip).
apt_privileges() {
	local missing=$1 package=$2
	if [[ $(id -u) -eq 0 ]]; then
		sudo=()
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		sudo=(sudo -n)
	else
		log "$missing is missing and apt-get needs root: run 'apt-get install -y $package' as root"
		[[ -z "${CI:-}" ]] || exit 1
		exit 0
	fi
}

# apt_install PACKAGE installs PACKAGE without its recommended packages,
# updating the package lists first when the install fails (they may be
# missing or stale on a fresh machine). Call apt_privileges first.
apt_install() {
	local package=$1
	export DEBIAN_FRONTEND=noninteractive
	if ! "${sudo[@]}" apt-get install -y --no-install-recommends "$package"; then
		"${sudo[@]}" apt-get update
		"${sudo[@]}" apt-get install -y --no-install-recommends "$package"
	fi
}

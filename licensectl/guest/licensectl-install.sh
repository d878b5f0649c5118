#!/bin/sh
# licensectl-install: install the NVIDIA vGPU license from the licensectl license disk.
#
# Runs once at boot (licensectl-install.service, ordered before nvidia-gridd). KubeVirt turns the
# licensectl replica Secret into an ISO-9660 disk (kubevirt/kubevirt pkg/config/config.go builds it
# with genisoimage -joliet -rock, so file names are the Secret keys); this script finds that disk by
# serial (/dev/disk/by-id/*<serial>*) or volume label (/dev/disk/by-label/<label>), mounts it
# read-only and installs:
#   client_configuration_token.tok   -> /etc/nvidia/ClientConfigToken/licensectl_<sha256[0:16]>.tok (0744)
#   gridd.conf                       -> /etc/nvidia/gridd.conf (0644)
#   report-url, report-namespace,
#   report-credential, report-ca.crt -> /etc/licensectl/<same name> (0600; the credential is never printed)
# report-ca.crt is the CA bundle licensectl's reports listener is verified with (absent over plain HTTP).
# Files are written to a temporary name in the target directory and renamed into place. Token files
# this script installed earlier (licensectl_*.tok) are removed when stale; other *.tok files are
# never touched. If the token or gridd.conf changed, nvidia-gridd is restarted (it reads both only at
# start); running again with the same disk changes nothing and restarts nothing.
#
# Exit codes:
#   0  installed, or already up to date
#   1  usage or unexpected error
#   2  license disk not found
#   3  mounting the license disk failed
#   4  bad disk content (token or gridd.conf missing, empty or too large; no sha256 tool)
#   5  writing a file failed
#   6  restarting nvidia-gridd failed (the files are installed)
#
# Settings (environment, or shell assignments in /etc/default/licensectl):
#   LICENSECTL_DISK_SERIAL   disk serial to look for under /dev/disk/by-id (default LICENSECTL)
#   LICENSECTL_DISK_LABEL    ISO volume label to look for under /dev/disk/by-label (default LICENSECTL)
#   LICENSECTL_DISK_WAIT     seconds to wait for the disk to appear (default 30)
#   LICENSECTL_DISK_DIR      read the files from this directory instead of mounting a disk
#   LICENSECTL_ROOT          prefix for every path (image builds, tests); default empty
#   LICENSECTL_DEV_DIR       default $LICENSECTL_ROOT/dev/disk
#   LICENSECTL_RUN_DIR       private mount point parent, default $LICENSECTL_ROOT/run/licensectl
#   LICENSECTL_MOUNT, LICENSECTL_UMOUNT   mount/umount commands (default mount, umount)
#   LICENSECTL_GRIDD_UNIT    default nvidia-gridd.service
#   SYSTEMCTL                default systemctl
#   LICENSECTL_RESTART_CMD   restart command for guests without systemd, e.g. "rc-service nvidia-gridd restart"
#
# POSIX sh only (dash, busybox ash): no bashisms.

set -u
umask 022

PROG=licensectl-install
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { _code=$1; shift; log "error: $*"; exit "$_code"; }

ENV_FILE=${LICENSECTL_ENV_FILE:-${LICENSECTL_ROOT:-}/etc/default/licensectl}
case $ENV_FILE in /*) ;; *) ENV_FILE=./$ENV_FILE ;; esac
if [ -r "$ENV_FILE" ]; then
	# shellcheck disable=SC1090
	. "$ENV_FILE" || die 1 "cannot read $ENV_FILE"
fi

ROOT=${LICENSECTL_ROOT:-}
SERIAL=${LICENSECTL_DISK_SERIAL:-LICENSECTL}
LABEL=${LICENSECTL_DISK_LABEL:-LICENSECTL}
WAIT=${LICENSECTL_DISK_WAIT:-30}
DISK_DIR=${LICENSECTL_DISK_DIR:-}
DEV_DIR=${LICENSECTL_DEV_DIR:-$ROOT/dev/disk}
RUN_DIR=${LICENSECTL_RUN_DIR:-$ROOT/run/licensectl}
MOUNT=${LICENSECTL_MOUNT:-mount}
UMOUNT=${LICENSECTL_UMOUNT:-umount}
GRIDD_UNIT=${LICENSECTL_GRIDD_UNIT:-nvidia-gridd.service}
SYSTEMCTL=${SYSTEMCTL:-systemctl}
RESTART_CMD=${LICENSECTL_RESTART_CMD:-}

TOKEN_DIR=$ROOT/etc/nvidia/ClientConfigToken
GRIDD_CONF=$ROOT/etc/nvidia/gridd.conf
STATE_DIR=$ROOT/etc/licensectl
MAX_BYTES=65536

case $WAIT in '' | *[!0-9]*) die 1 "LICENSECTL_DISK_WAIT must be a number of seconds" ;; esac

MOUNTED=
MNT=
cleanup() {
	if [ -n "$MOUNTED" ]; then
		$UMOUNT "$MNT" >/dev/null 2>&1 || log "warning: could not unmount $MNT"
		MOUNTED=
	fi
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

sha256_of() {
	if command -v sha256sum >/dev/null 2>&1; then
		sha256sum <"$1" | cut -d' ' -f1
	elif command -v busybox >/dev/null 2>&1; then
		busybox sha256sum <"$1" | cut -d' ' -f1
	else
		return 1
	fi
}

size_of() { wc -c <"$1" | tr -d ' \t'; }

same_content() {
	if command -v cmp >/dev/null 2>&1; then
		cmp -s "$1" "$2"
	else
		[ "$(sha256_of "$1")" = "$(sha256_of "$2")" ]
	fi
}

# install_file SRC DEST MODE: atomically replace DEST. Returns 0 if written, 10 if already identical.
install_file() {
	_src=$1 _dest=$2 _mode=$3
	if [ -f "$_dest" ] && same_content "$_src" "$_dest"; then
		chmod "$_mode" "$_dest" 2>/dev/null || true # repair the mode; not a content change
		return 10
	fi
	_tmp=$(dirname "$_dest")/.$(basename "$_dest").licensectl-tmp.$$
	rm -f "$_tmp"
	if cp "$_src" "$_tmp" && chmod "$_mode" "$_tmp" && chown_root "$_tmp" && mv -f "$_tmp" "$_dest"; then
		return 0
	fi
	rm -f "$_tmp"
	return 1
}

chown_root() {
	if [ "$(id -u)" = 0 ]; then chown 0:0 "$1"; fi
}

find_disk() {
	for _p in "$DEV_DIR"/by-id/*"$SERIAL"*; do
		case $_p in *-part[0-9]*) continue ;; esac
		if [ -e "$_p" ]; then
			printf '%s\n' "$_p"
			return 0
		fi
	done
	if [ -e "$DEV_DIR/by-label/$LABEL" ]; then
		printf '%s\n' "$DEV_DIR/by-label/$LABEL"
		return 0
	fi
	return 1
}

# --- locate the license files --------------------------------------------------------------
if [ -n "$DISK_DIR" ]; then
	[ -d "$DISK_DIR" ] || die 2 "LICENSECTL_DISK_DIR $DISK_DIR is not a directory"
	SRC=$DISK_DIR
else
	waited=0
	while ! DEV=$(find_disk); do
		if [ "$waited" -ge "$WAIT" ]; then
			die 2 "license disk not found (serial *$SERIAL* under $DEV_DIR/by-id, label $LABEL under $DEV_DIR/by-label)"
		fi
		sleep 1
		waited=$((waited + 1))
	done
	if ! { mkdir -p "$RUN_DIR" && chmod 0700 "$RUN_DIR"; }; then die 3 "cannot create $RUN_DIR"; fi
	MNT=$RUN_DIR/disk
	mkdir -p "$MNT" || die 3 "cannot create $MNT"
	$UMOUNT "$MNT" >/dev/null 2>&1 || true # left over from an interrupted run
	$MOUNT -t iso9660 -o ro,nodev,nosuid,noexec "$DEV" "$MNT" || die 3 "cannot mount $DEV"
	MOUNTED=1
	SRC=$MNT
fi

TOKEN_SRC=$SRC/client_configuration_token.tok
CONF_SRC=$SRC/gridd.conf
for f in "$TOKEN_SRC" "$CONF_SRC"; do
	if [ ! -f "$f" ] || [ ! -s "$f" ]; then die 4 "$(basename "$f") missing or empty on the license disk"; fi
	[ "$(size_of "$f")" -le "$MAX_BYTES" ] || die 4 "$(basename "$f") is larger than $MAX_BYTES bytes"
done

SHA=$(sha256_of "$TOKEN_SRC") || die 4 "no sha256sum (coreutils or busybox) available"
case $SHA in *[!0-9a-f]* | '') die 4 "could not hash the token" ;; esac
[ "${#SHA}" -eq 64 ] || die 4 "could not hash the token"
TOKEN_NAME=licensectl_$(printf '%s' "$SHA" | cut -c1-16).tok

changed=

# --- token ---------------------------------------------------------------------------------
mkdir -p "$TOKEN_DIR" || die 5 "cannot create $TOKEN_DIR"
install_file "$TOKEN_SRC" "$TOKEN_DIR/$TOKEN_NAME" 0744
case $? in
0) changed=1; log "installed token $TOKEN_NAME" ;;
10) ;;
*) die 5 "cannot write $TOKEN_DIR/$TOKEN_NAME" ;;
esac
for f in "$TOKEN_DIR"/licensectl_*.tok; do
	[ -e "$f" ] || continue
	[ "$f" = "$TOKEN_DIR/$TOKEN_NAME" ] && continue
	rm -f "$f" || die 5 "cannot remove stale token $f"
	changed=1
	log "removed stale token $(basename "$f")"
done
for f in "$TOKEN_DIR"/*.tok; do
	[ -e "$f" ] || continue
	case $(basename "$f") in licensectl_*) continue ;; esac
	log "warning: foreign token $(basename "$f") is also present; nvidia-gridd may use either"
done

# --- gridd.conf ----------------------------------------------------------------------------
mkdir -p "$(dirname "$GRIDD_CONF")" || die 5 "cannot create $(dirname "$GRIDD_CONF")"
install_file "$CONF_SRC" "$GRIDD_CONF" 0644
case $? in
0) changed=1; log "installed gridd.conf" ;;
10) ;;
*) die 5 "cannot write $GRIDD_CONF" ;;
esac

# --- report settings for licensectl-probe ----------------------------------------------------
if ! { mkdir -p "$STATE_DIR" && chmod 0700 "$STATE_DIR"; }; then die 5 "cannot create $STATE_DIR"; fi
for key in report-url report-namespace report-credential report-ca.crt; do
	if [ -f "$SRC/$key" ] && [ -s "$SRC/$key" ]; then
		_max=4096
		[ "$key" = report-ca.crt ] && _max=$MAX_BYTES
		[ "$(size_of "$SRC/$key")" -le "$_max" ] || die 4 "$key is larger than $_max bytes"
		install_file "$SRC/$key" "$STATE_DIR/$key" 0600
		case $? in
		0) log "updated $key" ;;
		10) ;;
		*) die 5 "cannot write $STATE_DIR/$key" ;;
		esac
	elif [ -e "$STATE_DIR/$key" ]; then
		rm -f "$STATE_DIR/$key" || die 5 "cannot remove $STATE_DIR/$key"
		log "removed $key (not on the license disk)"
	fi
done

cleanup

# --- restart nvidia-gridd if its inputs changed ----------------------------------------------
if [ -z "$changed" ]; then
	log "license unchanged"
	exit 0
fi
if [ -n "$RESTART_CMD" ]; then
	# shellcheck disable=SC2086 # the command is a word list by design
	$RESTART_CMD || die 6 "restart command failed"
else
	# `restart` stops with the unit's KillSignal (SIGTERM by default, so gridd returns its lease)
	# and starts the unit even if it had stopped. --no-block: at boot a start job for gridd is
	# queued behind this unit (Before=), and waiting for it from here would deadlock.
	command -v "$SYSTEMCTL" >/dev/null 2>&1 || die 6 "no $SYSTEMCTL: restart nvidia-gridd yourself or set LICENSECTL_RESTART_CMD"
	"$SYSTEMCTL" --no-block restart "$GRIDD_UNIT" || die 6 "$SYSTEMCTL restart $GRIDD_UNIT failed"
fi
log "restarted $GRIDD_UNIT"
exit 0

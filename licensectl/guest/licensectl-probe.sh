#!/bin/sh
# licensectl-probe: report this guest's NVIDIA vGPU license state to licensectl.
#
# Runs on a timer (licensectl-probe.timer). Collects `nvidia-smi -q -x` (or `nvidia-smi -q` when the
# XML form fails), the SHA-256 of the token licensectl-install put in place, the SMBIOS system UUID
# (KubeVirt sets it to the VMI's spec.domain.firmware.uuid), the hostname, the guest clock and the
# last nvidia-gridd log lines, and POSTs them to the report URL from the license disk with the
# namespace's credential. Wire format: docs/guest.md. The credential is never printed, and with curl
# it is passed on stdin, not on the command line (command lines are visible to every local user).
#
# Exit codes:
#   0  report accepted (HTTP 202)
#   1  unexpected error (e.g. SMBIOS UUID unreadable)
#   2  not configured: report-url, report-namespace or report-credential missing or malformed
#   3  no HTTP client (curl or wget), or only a wget that cannot verify https against the CA
#   4  report refused by licensectl (a 4xx other than 408/429: retrying will not help)
#   5  gave up after bounded retries (network errors, 5xx, 408, 429)
#
# Settings (environment, or shell assignments in /etc/default/licensectl):
#   LICENSECTL_ROOT          prefix for every path (tests); default empty
#   LICENSECTL_ATTEMPTS      POST attempts (default 4)
#   LICENSECTL_BACKOFF       first retry delay in seconds, doubled per retry (default 2)
#   LICENSECTL_DEADLINE      total seconds for all attempts (default 45, below the timer period)
#   LICENSECTL_HTTP_CLIENT   auto | curl | wget (default auto: curl if present)
#   LICENSECTL_CA_FILE       CA bundle to verify an https report URL with (default: report-ca.crt from
#                            the license disk when present, else the system trust store)
#   LICENSECTL_LOG_LINES     nvidia-gridd log lines to send (default 50)
#   LICENSECTL_GRIDD_UNIT    default nvidia-gridd.service
#   NVIDIA_SMI, JOURNALCTL   commands (default nvidia-smi, journalctl)
#
# POSIX sh only (dash, busybox ash): no bashisms, no Python.

set -u
umask 077

PROG=licensectl-probe
PROBE_VERSION=1.1
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { _code=$1; shift; log "error: $*"; exit "$_code"; }

ENV_FILE=${LICENSECTL_ENV_FILE:-${LICENSECTL_ROOT:-}/etc/default/licensectl}
case $ENV_FILE in /*) ;; *) ENV_FILE=./$ENV_FILE ;; esac
if [ -r "$ENV_FILE" ]; then
	# shellcheck disable=SC1090
	. "$ENV_FILE" || die 1 "cannot read $ENV_FILE"
fi

ROOT=${LICENSECTL_ROOT:-}
ATTEMPTS=${LICENSECTL_ATTEMPTS:-4}
BACKOFF=${LICENSECTL_BACKOFF:-2}
DEADLINE=${LICENSECTL_DEADLINE:-45}
HTTP_CLIENT=${LICENSECTL_HTTP_CLIENT:-auto}
CA_FILE=${LICENSECTL_CA_FILE:-}
LOG_LINES=${LICENSECTL_LOG_LINES:-50}
GRIDD_UNIT=${LICENSECTL_GRIDD_UNIT:-nvidia-gridd.service}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
JOURNALCTL=${JOURNALCTL:-journalctl}

STATE_DIR=$ROOT/etc/licensectl
TOKEN_DIR=$ROOT/etc/nvidia/ClientConfigToken
UUID_FILE=$ROOT/sys/class/dmi/id/product_uuid
LOG_FILES="$ROOT/var/log/syslog $ROOT/var/log/messages"
SMI_MAX_BYTES=400000

check_number() {
	case $2 in '' | *[!0-9]*) die 1 "LICENSECTL_$1 must be a non-negative integer" ;; esac
}
check_number ATTEMPTS "$ATTEMPTS"
check_number BACKOFF "$BACKOFF"
check_number DEADLINE "$DEADLINE"
check_number LOG_LINES "$LOG_LINES"

# --- configuration from the license disk (installed by licensectl-install) --------------------
read_setting() {
	[ -r "$STATE_DIR/$1" ] || return 1
	tr -d ' \t\r\n' <"$STATE_DIR/$1"
}
URL=$(read_setting report-url) || die 2 "no report URL ($STATE_DIR/report-url)"
NS=$(read_setting report-namespace) || die 2 "no report namespace"
CRED=$(read_setting report-credential) || die 2 "no report credential"
case $URL in http://?* | https://?*) ;; *) die 2 "report URL must be http(s)://..." ;; esac
case $NS in '' | *[!a-z0-9-]*) die 2 "report namespace is malformed" ;; esac
case $CRED in '' | *[!A-Za-z0-9_-]*) die 2 "report credential is malformed" ;; esac
# An https URL is verified against licensectl's CA from the license disk unless LICENSECTL_CA_FILE says
# otherwise; the scheme alone decides plain HTTP, never a missing CA.
case $URL in
https://*)
	if [ -z "$CA_FILE" ] && [ -s "$STATE_DIR/report-ca.crt" ]; then CA_FILE=$STATE_DIR/report-ca.crt; fi
	if [ -n "$CA_FILE" ] && [ ! -r "$CA_FILE" ]; then die 2 "CA file $CA_FILE is not readable"; fi
	;;
*) CA_FILE= ;;
esac

# --- HTTP client ---------------------------------------------------------------------------
case $HTTP_CLIENT in
auto)
	if command -v curl >/dev/null 2>&1; then
		HTTP_CLIENT=curl
	elif command -v wget >/dev/null 2>&1; then
		HTTP_CLIENT=wget
	else
		die 3 "neither curl nor wget found"
	fi
	;;
curl | wget) command -v "$HTTP_CLIENT" >/dev/null 2>&1 || die 3 "$HTTP_CLIENT not found" ;;
*) die 1 "LICENSECTL_HTTP_CLIENT must be auto, curl or wget" ;;
esac
# busybox wget cannot verify against a CA file (it has no --ca-certificate): refuse rather than
# send the credential to an unverified server.
if [ "$HTTP_CLIENT" = wget ] && [ -n "$CA_FILE" ] && ! wget --help 2>&1 | grep -q -e '--ca-certificate'; then
	die 3 "this wget cannot verify $URL with a CA file; install curl (or GNU wget)"
fi

WORK=$(mktemp -d) || die 1 "cannot create a temporary directory"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 1' HUP INT TERM

run_limited() {
	if command -v timeout >/dev/null 2>&1; then timeout 30 "$@"; else "$@"; fi
}

sha256_of() {
	if command -v sha256sum >/dev/null 2>&1; then
		sha256sum <"$1" | cut -d' ' -f1
	elif command -v busybox >/dev/null 2>&1; then
		busybox sha256sum <"$1" | cut -d' ' -f1
	else
		return 1
	fi
}

# Keep printable ASCII, tab and newline; shift lines that would look like section markers; end
# every line with a newline. The report must be valid UTF-8 and must not end a section early.
sanitize() {
	LC_ALL=C tr -cd '\11\12\40-\176' | awk -v max="$1" '{ sub(/^---/, " ---"); print substr($0, 1, max) }'
}

# --- collect ---------------------------------------------------------------------------------
[ -r "$UUID_FILE" ] || die 1 "cannot read the SMBIOS UUID ($UUID_FILE; run as root)"
UUID=$(tr -d ' \t\r\n' <"$UUID_FILE" | tr 'A-F' 'a-f')
case $UUID in ????????-????-????-????-????????????) ;; *) die 1 "SMBIOS UUID is malformed" ;; esac

HOST=$(uname -n 2>/dev/null | LC_ALL=C tr -cd 'A-Za-z0-9._-' | cut -c1-253)

TOKEN_SHA=none
set -- "$TOKEN_DIR"/licensectl_*.tok
if [ "$#" -eq 1 ] && [ -f "$1" ]; then
	TOKEN_SHA=$(sha256_of "$1") || TOKEN_SHA=none
	case $TOKEN_SHA in *[!0-9a-f]* | '') TOKEN_SHA=none ;; esac
elif [ "$#" -gt 1 ]; then
	log "warning: several licensectl tokens installed; reporting none"
fi

# SMI_STATUS goes into the report (format 2): ok, failed, or missing = no nvidia-smi at all, which
# means an image without the vGPU guest driver (reported as such, not as a silent guest).
SMI_SECTION=
SMI_STATUS=missing
if command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
	SMI_STATUS=failed
	if run_limited "$NVIDIA_SMI" -q -x >"$WORK/smi" 2>/dev/null && [ -s "$WORK/smi" ] &&
		[ "$(wc -c <"$WORK/smi" | tr -d ' ')" -le "$SMI_MAX_BYTES" ]; then
		SMI_SECTION=nvidia-smi-xml
		SMI_STATUS=ok
	elif run_limited "$NVIDIA_SMI" -q >"$WORK/smi" 2>/dev/null && [ -s "$WORK/smi" ] &&
		[ "$(wc -c <"$WORK/smi" | tr -d ' ')" -le "$SMI_MAX_BYTES" ]; then
		SMI_SECTION=nvidia-smi-text
		SMI_STATUS=ok
	else
		log "warning: nvidia-smi failed; reporting without GPU state"
	fi
else
	log "warning: $NVIDIA_SMI not found (no vGPU guest driver?); reporting driver missing"
fi

HAVE_LOG=
if command -v "$JOURNALCTL" >/dev/null 2>&1 &&
	"$JOURNALCTL" -u "$GRIDD_UNIT" -n "$LOG_LINES" --no-pager -q -o short-iso --utc >"$WORK/log" 2>/dev/null &&
	[ -s "$WORK/log" ]; then
	HAVE_LOG=1
else
	for f in $LOG_FILES; do
		if [ -r "$f" ] && grep -h 'nvidia-gridd' "$f" 2>/dev/null | tail -n "$LOG_LINES" >"$WORK/log" &&
			[ -s "$WORK/log" ]; then
			HAVE_LOG=1
			break
		fi
	done
fi

{
	printf 'licensectl-report: 2\n'
	printf 'uuid: %s\n' "$UUID"
	printf 'hostname: %s\n' "$HOST"
	printf 'clock: %s\n' "$(date +%s)"
	printf 'token-sha256: %s\n' "$TOKEN_SHA"
	printf 'probe-version: %s\n' "$PROBE_VERSION"
	printf 'nvidia-smi: %s\n' "$SMI_STATUS"
	if [ -n "$SMI_SECTION" ]; then
		printf '%s\n' "--- $SMI_SECTION"
		sanitize 4096 <"$WORK/smi"
	fi
	if [ -n "$HAVE_LOG" ]; then
		printf '%s\n' "--- gridd-log"
		sanitize 1024 <"$WORK/log"
	fi
	printf '%s\n' "--- end"
} >"$WORK/body" || die 1 "cannot write the report"

# --- send --------------------------------------------------------------------------------------
# post TIMEOUT: POST the body; prints the HTTP status (000 when no response arrived).
post_curl() {
	set -- -q -sS -X POST --data-binary "@$WORK/body" \
		-H 'Content-Type: text/plain; charset=utf-8' -H "X-Licensectl-Namespace: $NS" \
		--connect-timeout 5 --max-time "$1" -o "$WORK/resp" -w '%{http_code}'
	if [ -n "$CA_FILE" ]; then set -- "$@" --cacert "$CA_FILE"; fi
	# The Authorization header travels in a config read from stdin (printf is a shell builtin).
	printf 'header = "Authorization: Bearer %s"\n' "$CRED" |
		curl "$@" -K - -- "$URL" 2>"$WORK/err" || true
}

post_wget() {
	# wget has no way to read headers from a file: the credential is briefly on its command line.
	# The time limit comes from `timeout`: busybox wget may be built without -T (and some builds
	# crash on it, e.g. Debian's busybox 1.35).
	_limit=$1
	set -- -S -O "$WORK/resp" --post-file "$WORK/body" \
		--header 'Content-Type: text/plain; charset=utf-8' --header "X-Licensectl-Namespace: $NS" \
		--header "Authorization: Bearer $CRED"
	if [ -n "$CA_FILE" ]; then set -- "$@" --ca-certificate="$CA_FILE"; fi
	if command -v timeout >/dev/null 2>&1; then
		timeout "$_limit" wget "$@" "$URL" >/dev/null 2>"$WORK/err" || true
	else
		wget "$@" "$URL" >/dev/null 2>"$WORK/err" || true
	fi
	_code=$(sed -n 's/.*HTTP\/[0-9.]* \([0-9][0-9][0-9]\).*/\1/p' "$WORK/err" | tail -n 1)
	printf '%s' "${_code:-000}"
}

error_reason() {
	[ -r "$WORK/resp" ] || return 0
	sed -n 's/.*"error": *"\([a-z_]*\)".*/\1/p' "$WORK/resp" | head -n 1
}

# client_error: why the HTTP client got no (usable) answer, from its stderr: curl's `curl: (7) Failed
# to connect ...` or `curl: (60) SSL certificate problem ...` (its first line: curl explains on more),
# wget's `wget: ...` error, else the client's last line. Bounded to one line of 200 printable
# characters; header lines are skipped and anything that looks like a credential (a Bearer value, a
# run of 32+ base64url characters) is masked, so no secret is logged.
client_error() {
	[ -s "$WORK/err" ] || return 0
	_line=$(grep -e '^curl: ' -e '^wget: ' "$WORK/err" | head -n 1)
	[ -n "$_line" ] || _line=$(grep -v -e '^ ' -e '^HTTP/' -e '^--' -e '^$' "$WORK/err" | tail -n 1)
	printf '%s\n' "$_line" |
		sed -e 's/[Bb]earer [^ ]*/Bearer ***/g' -e 's/[A-Za-z0-9_-]\{32,\}/***/g' |
		tr -d '\000-\037\177' | cut -c 1-200
}

# failure_detail CODE: "HTTP <code>" plus the server's error reason or the client's error, if any.
failure_detail() {
	_detail="HTTP $1"
	_reason=$(error_reason)
	_client=$(client_error)
	[ -z "$_reason" ] || _detail="$_detail $_reason"
	[ -z "$_client" ] || _detail="$_detail; $_client"
	printf '%s' "$_detail"
}

start=$(date +%s)
attempt=1
delay=$BACKOFF
while :; do
	left=$((DEADLINE - ($(date +%s) - start)))
	[ "$left" -gt 0 ] || break
	t=$left
	[ "$t" -le 20 ] || t=20
	rm -f "$WORK/resp" "$WORK/err"
	if [ "$HTTP_CLIENT" = curl ]; then code=$(post_curl "$t"); else code=$(post_wget "$t"); fi
	case $code in
	2??)
		log "report accepted (HTTP $code via $HTTP_CLIENT)"
		exit 0
		;;
	409)
		if [ "$attempt" -gt 1 ]; then
			log "report already accepted by an earlier attempt"
			exit 0
		fi
		die 4 "report refused ($(failure_detail 409))"
		;;
	408 | 429 | 5?? | 000)
		log "attempt $attempt failed ($(failure_detail "$code"))"
		;;
	4??)
		die 4 "report refused ($(failure_detail "$code"))"
		;;
	*)
		log "attempt $attempt failed (unexpected status; $(failure_detail "$code"))"
		;;
	esac
	attempt=$((attempt + 1))
	[ "$attempt" -le "$ATTEMPTS" ] || break
	left=$((DEADLINE - ($(date +%s) - start)))
	[ "$delay" -lt "$left" ] || break
	sleep "$delay"
	delay=$((delay * 2))
done
die 5 "giving up after $((attempt - 1)) attempt(s)"

#!/usr/bin/env bash
# The system tools the fault test bed (xcecore/testing/faultbed.py) needs, on Debian/Ubuntu:
# ip and ss (iproute2), nft (nftables), nsenter and mount (util-linux, mount), sysctl (procps);
# PostgreSQL's server (initdb, pg_ctl: postgresql) for the accounting role's tests;
# and what the MUNGE authentication tests need (tests/core/test_munge*.py, [cluster] auth =
# "munge"): munged, munge and unmunge (munge), libmunge.so.2 (libmunge2), useradd and userdel
# (passwd) for the test users, chpasswd (passwd) and libpam.so.0 with pam_unix (libpam0g,
# libpam-modules) for the API server's PAM logon test (tests/apiserver/test_api_pam.py);
# etcd (etcd-server, etcdctl: etcd-client) for the etcd backend's tests (plugins/etcd);
# and a headless browser for the dashboard's test (tests/e2e/test_e2e_dashboard.py): chromium
# and chromedriver (chromium, chromium-driver; run as root, so the test passes --no-sandbox).
# Idempotent: installs only what is missing. Run as root (CI runs as root).
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "install-system-deps.sh: run as root (apt-get installs system packages)" >&2
  exit 1
fi
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v ss >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v nsenter >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
command -v sysctl >/dev/null || need+=(procps)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v munged >/dev/null || need+=(munge)
command -v unmunge >/dev/null || need+=(munge)
ldconfig -p | grep -q 'libmunge\.so\.2 ' || need+=(libmunge2)
command -v useradd >/dev/null || need+=(passwd)
command -v chpasswd >/dev/null || need+=(passwd)
ldconfig -p | grep -q 'libpam\.so\.0 ' || need+=(libpam0g)
compgen -G "/lib/*/security/pam_unix.so" >/dev/null || compgen -G "/usr/lib/*/security/pam_unix.so" \
  >/dev/null || need+=(libpam-modules)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -eq 0 ]; then
  echo "install-system-deps.sh: everything is installed"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u)
# Debian's etcd-server package enables a system etcd service on 127.0.0.1:2379; the tests start
# their own members on other ports and never use it. Stop it where a service manager runs it.
if command -v systemctl >/dev/null && systemctl is-active --quiet etcd 2>/dev/null; then
  systemctl disable --now etcd || true
fi

# shellcheck shell=bash
# `softroce.sh provision`: install the Debian packages when any is missing.

sr_missing_packages() {
  local p status missing=()
  for p in $SR_PACKAGES; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$p")
  done
  printf '%s\n' "${missing[@]}"
}

sr_provision() {
  command -v dpkg-query >/dev/null 2>&1 ||
    sr_die "$SR_E_ENV" "provision needs a Debian/Ubuntu system (dpkg-query not found); install the equivalents of: $SR_PACKAGES"
  local missing
  missing=$(sr_missing_packages | tr '\n' ' ')
  missing=${missing% }
  if [[ -z $missing ]]; then
    echo "softroce: all packages present ($SR_PACKAGES)"
    return 0
  fi
  if ! sr_is_root; then
    sr_die "$SR_E_ENV" "missing packages: $missing; run: sudo $SR_SELF provision"
  fi
  echo "softroce: installing: $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  # shellcheck disable=SC2086
  apt-get install -y --no-install-recommends $SR_PACKAGES
}

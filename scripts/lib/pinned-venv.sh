# Sourced by the test scripts. pinned_venv DIR PIP-ARG...: makes DIR a virtualenv holding
# exactly these pinned requirements (pip install's arguments: requirements, or
# `--no-deps -r LOCKFILE`), recreating it when they change (the arguments and every -r file's
# contents, recorded in DIR/.requirements) and reusing it otherwise.
#
# Disk: the test venv's torch and nvidia-* wheels are ~3 GB to download and ~5.4 GB installed
# (tests/python/requirements.lock). pip keeps every downloaded wheel in its temporary
# directory until the whole install ends, so on one disk the peak is the sum: a CI machine
# with 7.1 GB free ran out. Wheels are therefore not kept in pip's cache, and pip's temporary directory goes
# to /dev/shm (RAM-backed) when that has room for them, leaving only the installed files on
# the disk.
pinned_venv() {
  local venv="$1"
  shift
  local stamp="$venv/.requirements" want="$*" arg prev=""
  for arg in "$@"; do
    if [ "$prev" = -r ]; then want+=$'\n'"$(cat "$arg")"; fi
    prev="$arg"
  done
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "== creating $venv ($*)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    local tmp=""
    if [ -d /dev/shm ] && [ -w /dev/shm ] \
      && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -ge $((5 * 1024 * 1024)) ]; then
      tmp="$(mktemp -d /dev/shm/tokenmill-pip.XXXXXX)"
      echo "== pip's temporary files in $tmp"
    fi
    if [ -n "$tmp" ]; then
      TMPDIR="$tmp" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-cache-dir "$@" || { rm -rf "$tmp"; return 1; }
      rm -rf "$tmp"
    else
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@"
    fi
    printf '%s\n' "$want" > "$stamp"
  fi
}

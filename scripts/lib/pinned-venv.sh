# Sourced by the test scripts. pinned_venv DIR REQUIREMENT...: makes DIR a virtualenv holding
# exactly these pinned requirements, recreating it when the pins change (recorded in
# DIR/.requirements) and reusing it otherwise. Wheels are not kept in pip's cache: the test
# venv's torch and nvidia-* wheels are ~3 GB that a one-shot CI machine would store twice.
pinned_venv() {
  local venv="$1"
  shift
  local stamp="$venv/.requirements"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$*" ]; then
    echo "== creating $venv ($*)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "$@"
    echo "$*" > "$stamp"
  fi
}

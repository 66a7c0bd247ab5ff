# Sourced by scripts/setup_vllm.sh and scripts/setup_train.sh:
#   pinned_venv VENV REQS [EXTRA]
# sets up an integration's own venv: torch==2.13.0 (CPU build), every package of REQS pinned and
# installed with --no-deps, then the command EXTRA (given VENV; e.g. a package built from source),
# then torch_tpu installed editable from this checkout (the C++ core scripts/build.sh built).
# Idempotent: does nothing when VENV was set up from these pins (a stamp of REQS and pyproject.toml).
PINNED_PIP=(--disable-pip-version-check -q)

pinned_venv() {
  local venv=$1 reqs=$2 extra=${3:-}
  local want
  want="$(cat "$reqs" pyproject.toml | sha1sum | cut -c1-16)"
  if [ -f "$venv/.torch_tpu-setup" ] && [ "$(cat "$venv/.torch_tpu-setup")" = "$want" ]; then return 0; fi
  [ -x "$venv/bin/python" ] || ${PYTHON_BIN:-python3} -m venv "$venv"
  "$venv/bin/pip" install "${PINNED_PIP[@]}" torch==2.13.0
  "$venv/bin/pip" install "${PINNED_PIP[@]}" --no-deps -r "$reqs"
  if [ -n "$extra" ]; then "$extra" "$venv"; fi
  "$venv/bin/pip" install "${PINNED_PIP[@]}" --no-deps --no-build-isolation -e .
  echo "$want" > "$venv/.torch_tpu-setup"
}

# Sourced by scripts/setup_vllm.sh and scripts/setup_train.sh: an integration's own venv with
# torch==2.13.0 (CPU build), every package of its requirements file pinned and installed with
# --no-deps, and torch_tpu installed editable from this checkout (the C++ core scripts/build.sh built).
#   pinned_venv_current VENV REQS   true when VENV was set up from these pins (then nothing to do)
#   pinned_venv_begin VENV REQS     creates VENV, installs torch and the pins
#   pinned_venv_finish VENV REQS    installs torch_tpu editable and records the pins
PINNED_PIP=(--disable-pip-version-check -q)

_pinned_stamp() { cat "$2" pyproject.toml | sha1sum | cut -c1-16; }

pinned_venv_current() {
  [ -f "$1/.torch_tpu-setup" ] && [ "$(cat "$1/.torch_tpu-setup")" = "$(_pinned_stamp "$1" "$2")" ]
}

pinned_venv_begin() {
  [ -x "$1/bin/python" ] || ${PYTHON_BIN:-python3} -m venv "$1"
  "$1/bin/pip" install "${PINNED_PIP[@]}" torch==2.13.0
  "$1/bin/pip" install "${PINNED_PIP[@]}" --no-deps -r "$2"
}

pinned_venv_finish() {
  "$1/bin/pip" install "${PINNED_PIP[@]}" --no-deps --no-build-isolation -e .
  _pinned_stamp "$1" "$2" > "$1/.torch_tpu-setup"
}

"""Runs an integration's job (a launcher with its own process tree) for the tests in this folder."""
import os
import signal
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_job(cmd, what, timeout, env=None, cwd=ROOT):
    """Runs cmd in a new session; returns its output (stdout and stderr). Fails the test with the
    output's tail when it exits non-zero, or kills the whole process tree past the timeout."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{what} did not finish within {timeout}s:\n{out[-6000:]}")
    assert p.returncode == 0, out[-8000:]
    return out
